"""A model loaded from GGUF is de-quantized: its checkpoint and Hugging Face export are
written as the plain model it is (issue 16: ``actor_rollout_ref.model.path=smollm2``
died at its first checkpoint with "The model is quantized with gguf and is not
serializable" from ``save_pretrained``)."""


import pytest
import torch

from siirl.engine.common import checkpoint as ckpt
from siirl.engine.fsdp.backend import FSDPBackend
from siirl_smollm2 import smollm2_missing


def gguf_like_tiny_llama():
    """A tiny Llama carrying what transformers leaves on a de-quantized GGUF model."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.quantizers.quantizer_gguf import GgufHfQuantizer
    from transformers.utils.quantization_config import GgufConfig

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=2))
    model.hf_quantizer = GgufHfQuantizer(GgufConfig())
    model.config.quantization_config = GgufConfig()
    return model


def check_export(model, directory, tokenizer=None):
    from transformers import AutoModelForCausalLM

    quantizer = model.hf_quantizer
    FSDPBackend(model).export_hf(str(directory), tokenizer)
    assert model.hf_quantizer is quantizer  # the loaded model is left as it was
    assert "quantization_config" not in (directory / "config.json").read_text()
    loaded = AutoModelForCausalLM.from_pretrained(str(directory))
    assert getattr(loaded, "hf_quantizer", None) is None
    want, got = model.state_dict(), loaded.state_dict()
    assert all(torch.equal(want[k], got[k]) for k in got)


def test_save_pretrained_refuses_the_model_as_loaded(tmp_path):
    with pytest.raises(ValueError, match="gguf and is not serializable"):
        gguf_like_tiny_llama().save_pretrained(str(tmp_path / "raw"))


def test_export_of_a_dequantized_gguf_model_is_a_plain_transformers_folder(tmp_path):
    check_export(gguf_like_tiny_llama(), tmp_path / "hf")


def test_checkpoint_of_a_dequantized_gguf_model_round_trips(tmp_path):
    model = gguf_like_tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters())
    ckpt.save_checkpoint(str(tmp_path / "actor"), model, optimizer, {"update_count": 0})
    target = gguf_like_tiny_llama()
    with torch.no_grad():
        for p in target.parameters():
            p.zero_()
    ckpt.load_checkpoint(str(tmp_path / "actor"), target, torch.optim.AdamW(
        target.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 target.state_dict().values(), strict=True))




@pytest.mark.slow
@pytest.mark.skipif(bool(smollm2_missing()), reason=smollm2_missing() or "n/a")
def test_smollm2_from_gguf_exports_a_folder_transformers_loads(tmp_path):
    from siirl.engine.models import loader

    model, tokenizer = loader.load_model_and_tokenizer({"path": "smollm2"})  # ~20 s
    assert model.hf_quantizer is not None  # what made save_pretrained refuse it
    check_export(model, tmp_path / "hf", tokenizer)
