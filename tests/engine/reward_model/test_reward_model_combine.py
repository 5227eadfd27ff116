"""Rule scores plus the reward model's: rule + rm_weight x model per row, on the last
response token; rows of a data source without a rule get the model's score alone."""

import pytest
import torch

from siirl.data_coordinator.fields import DATA_SOURCE, GROUND_TRUTH, SCORE, TOKEN_LEVEL_SCORES
from siirl.data_coordinator.protocol import get_non_tensor, set_non_tensor
from siirl.engine.reward_manager.batch import BatchRewardManager
from siirl.engine.reward_manager.naive import NaiveRewardManager
from siirl.engine.reward_model.combine import RM_SCORES, place_on_last_token
from siirl.errors import ConfigError
from siirl_rm_batches import rollout_batch


class Chars:
    pad_token_id = 0

    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(chr(i) for i in row if i) for row in rows]


def scored_batch(texts, sources, truths, model):
    responses = [[ord(c) for c in t] for t in texts]
    batch = rollout_batch([[ord("q")]] * len(texts), responses, 0)
    set_non_tensor(batch, DATA_SOURCE, sources)
    set_non_tensor(batch, GROUND_TRUTH, truths)
    if model is not None:
        batch.set(RM_SCORES, place_on_last_token(torch.tensor(model), batch["response_mask"]))
    return batch


def manager(cls=NaiveRewardManager, **rm):
    return cls(config={"reward_model": rm}, tokenizer=Chars())


@pytest.mark.parametrize("cls", [NaiveRewardManager, BatchRewardManager])
def test_the_final_score_is_rule_plus_weighted_model_score(cls):
    batch = scored_batch(["18", "7", "100"], ["arithmetic"] * 3, ["18", "8", "100"],
                         [0.5, 0.25, -1.0])
    out = manager(cls, enable=True, rm_weight=2.0).compute_reward(batch)
    expected = [1.0 + 1.0, 0.0 + 0.5, 1.0 - 2.0]
    assert get_non_tensor(out.batch, SCORE) == pytest.approx(expected)
    tokens = out.batch[TOKEN_LEVEL_SCORES]
    for row, text in enumerate(["18", "7", "100"]):  # on the last response token only
        assert tokens[row, len(text) - 1].item() == pytest.approx(expected[row])
        assert torch.count_nonzero(tokens[row]) == 1
    assert out.metrics["reward/rule/mean"] == pytest.approx(2 / 3)
    assert out.metrics["critic/score/mean"] == pytest.approx(sum(expected) / 3)
    assert get_non_tensor(out.batch, "acc") == [True, False, True]  # the rule's own column


def test_weight_zero_leaves_the_rule_scores():
    batch = scored_batch(["18", "7"], ["arithmetic"] * 2, ["18", "8"], [0.9, 0.9])
    out = manager(enable=True, rm_weight=0.0).compute_reward(batch)
    assert get_non_tensor(out.batch, SCORE) == [1.0, 0.0]


def test_rows_without_a_rule_get_the_model_score_alone():
    batch = scored_batch(["18", "nice"], ["arithmetic", "my/chat"], ["18", ""], [0.5, 0.75])
    out = manager(enable=True, rm_weight=1.0).compute_reward(batch)
    assert get_non_tensor(out.batch, SCORE) == pytest.approx([1.5, 0.75])
    assert out.metrics["reward/rule/mean"] == 1.0  # the rows a rule scored
    assert out.metrics["reward/errors"] == 0.0
    # without a reward model such a row is still a setup error
    plain = scored_batch(["nice"], ["my/chat"], [""], None)
    with pytest.raises(ConfigError, match="'my/chat'"):
        manager().compute_reward(plain)


def test_without_model_scores_the_rules_alone_score():
    # validation: the reward node's model scores are not computed there
    batch = scored_batch(["18", "nice"], ["arithmetic", "my/chat"], ["18", ""], None)
    out = manager(enable=True).compute_reward(batch)
    assert get_non_tensor(out.batch, SCORE) == [1.0, 0.0]
    assert "reward/rule/mean" not in out.metrics
