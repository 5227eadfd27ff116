"""Check the megatron engine on a CUDA machine: weight-bridge round trip, log-prob parity
with Hugging Face, and GRPO steps with ``strategy=megatron`` in fp32 and in bf16
(``megatron.dtype=bfloat16``: megatron's mixed-precision distributed optimizer on CUDA)
(tokens/s, model FLOPs use).

    python tools/gpu/check_megatron.py [--steps 6] [--out megatron_gpu.json]

The same checks run on CPU in CI (tests/engine/megatron/); this script runs them on CUDA
with NCCL, where megatron-core's own kernels and code paths are used (the CPU adapters
switch themselves off when CUDA is available). Needs torch with CUDA, megatron-core
(``pip install "siirl-engine[megatron]"``) and the repo's packages. Prints a table and
writes JSON; record the output in docs/megatron.md with the date and the device.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def tiny_models():
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    common = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                  max_position_embeddings=64)
    return {"llama": LlamaForCausalLM(LlamaConfig(**common)).eval(),
            "qwen2": Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True)).eval()}


def parity_checks(device: torch.device) -> dict:
    from siirl.engine.common.config import typed_config
    from siirl.engine.megatron.bridge import hf_to_megatron, megatron_to_hf
    from siirl.engine.megatron_workers import (
        build_megatron_model,
        init_megatron,
        megatron_logprobs,
    )
    from siirl.engine.models.logprob import response_logprobs

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 parity, not TF32
    torch.backends.cudnn.allow_tf32 = False
    init_megatron(typed_config({"trainer": {"seed": 1}}), seed=1)
    out = {}
    for name, hf in tiny_models().items():
        state = {k: v for k, v in hf.state_dict().items()}
        shard = hf_to_megatron(state, hf.config, 0, 1, 0, 1)
        back = megatron_to_hf([shard], hf.config)
        exact = all(torch.equal(back[k], state[k]) for k in back)
        hf = hf.to(device)
        model = build_megatron_model(hf, device).eval()
        ids = torch.randint(0, 128, (4, 24), device=device)
        mask = torch.ones_like(ids)
        mask[0, :5] = 0  # a left-padded row
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            want, _ = response_logprobs(hf, ids, mask, pos, 8)
            got, _ = megatron_logprobs(model, ids, mask, pos, 8)
        out[name] = {"round_trip_bit_exact": exact,
                     "logprob_max_abs_diff": float((want - got).abs().max())}
    return out


# bf16 weights and compute with fp32 main weights in megatron's distributed optimizer
BF16 = ("actor_rollout_ref.actor.megatron.dtype=bfloat16",
        "actor_rollout_ref.ref.megatron.dtype=bfloat16")


def grpo_steps(steps: int, device: str, overrides: tuple = ()) -> dict:
    exe = Path(sys.executable).parent / "siirl-train"
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [str(exe), "actor_rollout_ref.actor.strategy=megatron", f"trainer.device={device}",
               f"trainer.total_training_steps={steps}", "trainer.test_freq=-1",
               "trainer.val_before_train=false", "trainer.save_freq=-1",
               "trainer.logger=[console]", "data.train_batch_size=64",
               "actor_rollout_ref.actor.ppo_mini_batch_size=64",
               f"trainer.default_local_dir={run_dir}", *overrides]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
        if proc.returncode:
            return {"error": proc.stderr[-2000:]}
        records = [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]
    train = [r for r in records if "perf/actor_tokens_per_s" in r][1:]  # skip warm-up
    tokens_per_s = sum(r["perf/actor_tokens_per_s"] for r in train) / max(len(train), 1)
    from siirl.engine.models.loader import load_model_and_tokenizer
    from siirl.execution.device import model_flops_use

    params = sum(p.numel() for p in load_model_and_tokenizer(None)[0].parameters())
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    flops = 6.0 * params * tokens_per_s  # forward + backward of the update
    return {"steps": steps, "wall_s": time.perf_counter() - start,
            "actor_tokens_per_s": tokens_per_s, "model_params": params,
            "device_name": name,
            # against the dtype's dense peak; None where no peak is known
            "mfu": model_flops_use(flops, name, "bf16" if BF16[0] in overrides else "fp32"),
            "critic/score/mean": [r.get("critic/score/mean") for r in records
                                  if "critic/score/mean" in r]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", default="megatron_gpu.json")
    parser.add_argument("--cpu", action="store_true",
                        help="dry run of this script on the CPU (no GPU figures)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.cpu:
        print("no CUDA device: this script checks the GPU path (CPU checks are in tests/; "
              "--cpu dry-runs the script)")
        return 2
    import megatron.core

    from siirl.execution.device import format_mfu

    device = "cpu" if args.cpu else "cuda"
    report = {"date": time.strftime("%Y-%m-%d"),
              "device": "cpu" if args.cpu else torch.cuda.get_device_name(),
              "torch": torch.__version__, "megatron_core": megatron.core.__version__,
              "parity": parity_checks(torch.device(device)),
              "grpo": grpo_steps(args.steps, device),
              "grpo_bf16": grpo_steps(args.steps, device, BF16)}
    print(f"{'check':<34}{'result':>20}")
    for name, result in report["parity"].items():
        print(f"{name + ' round trip bit-exact':<34}{str(result['round_trip_bit_exact']):>20}")
        print(f"{name + ' log-prob max |diff|':<34}{result['logprob_max_abs_diff']:>20.3g}")
    for key, label in (("grpo", "GRPO"), ("grpo_bf16", "GRPO bf16")):
        grpo = report[key]
        if "error" in grpo:
            print(f"{label} steps failed: {grpo['error']}")
            continue
        print(f"{label + ' actor tokens/s':<34}{grpo['actor_tokens_per_s']:>20.0f}")
        mfu = format_mfu(grpo["mfu"], grpo["device_name"])
        print(f"{label + ' model FLOPs use':<34}{mfu:>20}")  # against its dtype's peak
    Path(args.out).write_text(json.dumps(report, indent=1))
    ok = all(r["round_trip_bit_exact"] and r["logprob_max_abs_diff"] < 1e-5
             for r in report["parity"].values()) and "error" not in report["grpo"] and \
        "error" not in report["grpo_bf16"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
