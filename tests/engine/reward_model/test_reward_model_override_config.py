"""verl's ``reward_model.model.override_config`` reaches the reward model's config (the
sequence classifier's, and the generative judge's own model's)."""

import torch

from siirl.engine.reward_model.config import RewardModelModelArguments
from siirl.engine.reward_model.loading import (
    BUILTIN_TINY_REWARD,
    load_causal_lm,
    load_classifier,
)

torch.set_num_threads(1)


def _model(path, overrides):
    return RewardModelModelArguments(path=path, input_tokenizer=None, external_lib=None,
                                     use_fused_kernels=False, override_config=overrides)


def test_override_config_changes_the_classifiers_config_and_keeps_its_weights():
    plain, _ = load_classifier(_model(BUILTIN_TINY_REWARD, {}), torch.device("cpu"))
    changed, _ = load_classifier(_model(BUILTIN_TINY_REWARD, {"attention_dropout": 0.25}),
                                 torch.device("cpu"))
    assert changed.config.attention_dropout == 0.25 != plain.config.attention_dropout
    assert changed.config.num_labels == 1
    for (name, a), (_, b) in zip(plain.named_parameters(), changed.named_parameters(),
                                 strict=True):
        assert torch.equal(a, b), name


def test_override_config_reaches_the_judges_own_model():
    judge, _ = load_causal_lm(_model("builtin:tiny-arith", {"attention_dropout": 0.25}),
                              torch.device("cpu"))
    assert judge.config.attention_dropout == 0.25
