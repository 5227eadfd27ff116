"""The decoding loops pass and read the KV cache by the name the model takes, so
transformers 5 logs no deprecation notice for the old name."""

import inspect
from types import SimpleNamespace

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from siirl.engine.rollout.kv_cache import cache_argument, output_cache

NEW_NAMES = "cache" in inspect.signature(LlamaForCausalLM.forward).parameters


class _OldStyle(torch.nn.Module):
    def forward(self, input_ids, past_key_values=None, use_cache=True):
        return SimpleNamespace(logits=None, past_key_values=("old",))


def test_the_name_a_model_takes():
    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16,
                                         num_hidden_layers=1, num_attention_heads=2))
    assert cache_argument(model) == ("cache" if NEW_NAMES else "past_key_values")
    assert cache_argument(_OldStyle()) == "past_key_values"
    out = model(input_ids=torch.tensor([[1, 2]]), use_cache=True)
    assert output_cache(out) is not None and hasattr(output_cache(out), "get_seq_length")
    assert output_cache(_OldStyle()(None)) == ("old",)


def test_no_deprecation_for_a_decoding_loop(monkeypatch):
    import warnings

    import transformers.utils.generic as generic

    from siirl.engine.rollout.sampler import decode

    logged = []  # warning_once would say it once per process: record every call
    monkeypatch.setattr(generic.logger, "warning_once", lambda msg, *a: logged.append(msg))
    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16,
                                         num_hidden_layers=1, num_attention_heads=2))
    ids = torch.tensor([[1, 2, 3]] * 4)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        tokens = decode(model, ids, torch.ones_like(ids), torch.arange(3).expand(4, 3), 3,
                        [0], 0, greedy=True)
    assert tokens.shape[0] == 4
    assert logged == []
    assert not [w for w in warned if "deprecat" in str(w.message).lower()]
