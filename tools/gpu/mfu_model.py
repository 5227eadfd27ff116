"""The model train_mfu.py measures: Qwen2.5-0.5B's shape (or a tiny model of the same
family for the CPU check), randomly initialised from a transformers ``Qwen2Config`` (no
download), and its model FLOPs per token."""

from __future__ import annotations

from typing import Optional

import torch

# Qwen/Qwen2.5-0.5B's config.json, minus what a random init does not need
QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                  tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6)
# same family (GQA, qkv bias, tied head), small enough for a CPU test in seconds
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=160, vocab_size=512,
            tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6)


def qwen2_config(tiny: bool, seq: int):
    from transformers import Qwen2Config

    shape = TINY if tiny else QWEN25_05B
    # 32768 as Qwen2.5-0.5B; longer only when --seq asks for it
    return Qwen2Config(**shape, max_position_embeddings=max(32768, seq))


def build_model(config, device: torch.device, seed: int = 0) -> torch.nn.Module:
    """fp32 weights (siiRL's master weights) initialised on ``device`` directly: a 0.5B
    model's random init on the CPU alone takes longer than the measured steps."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        return Qwen2ForCausalLM(config).float()


def nonembedding_params(model: torch.nn.Module) -> int:
    """Parameters outside the input embedding (a tied LM head is the same tensor, so it
    is not counted; an untied one would be)."""
    total = sum(p.numel() for p in model.parameters())  # tied weights are listed once
    return total - model.get_input_embeddings().weight.numel()


def flops_per_token(n_nonembedding: int, layers: int, hidden: int, seq: int) -> int:
    """Training FLOPs per token: 6 N (forward + backward of the weight matmuls) plus
    12 L h s (attention scores and their weighted sum, forward + backward). Activation
    recomputation and the LM head's matmul are not counted, so MFU is a lower bound."""
    return 6 * n_nonembedding + 12 * layers * hidden * seq


def peak_flops(device_name: str, override: Optional[float]) -> Optional[float]:
    """Dense bf16 peak FLOP/s of one device: ``--peak``, else siiRL's table by name (H100,
    H200: 989e12; A100: 312e12); None for a CPU or an unlisted GPU."""
    if override:
        return float(override)
    from siirl.execution.device import peak_tflops

    peak = peak_tflops(device_name, "bf16")
    return peak * 1e12 if peak else None
