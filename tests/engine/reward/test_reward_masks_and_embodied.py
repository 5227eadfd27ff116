"""The response-mask fallback, empty batches, and the embodied reward manager.

Everything runs in this process (function objects, no worker processes), so it is fast.
Each test states a behaviour that mutation testing (``nox -s mutmut -- reward``) found
no test for; docs/mutation.md lists the mutants they kill and the ones that change
nothing observable.
"""


import pytest
import torch
from reward_fakes import CharTokenizer, make_reward_batch

from siirl.data_coordinator.protocol import get_non_tensor
from siirl.engine.reward_manager.naive import NaiveRewardManager

# ---- the response mask fallback, empty batches, the embodied manager -------------------------

def test_without_a_response_mask_the_response_part_of_the_attention_mask_is_used():
    batch = make_reward_batch(["7", "77"], ["arithmetic"] * 2, ["7", "7"], width=3)
    mask = batch["response_mask"].clone()
    del batch["response_mask"]
    batch["attention_mask"] = torch.cat([torch.ones(2, 2), mask], dim=1)  # prompt of 2
    out = NaiveRewardManager(config={}, tokenizer=CharTokenizer()).compute_reward(batch)
    assert get_non_tensor(out.batch, "score") == [1.0, 0.0]
    assert out.batch["token_level_scores"][0].tolist() == [1.0, 0.0, 0.0]


def test_an_empty_batch_with_the_overlong_buffer_reports_zero_penalties():
    config = {"data": {"max_response_length": 4},
              "reward_model": {"overlong_buffer": {"enable": True, "len": 2}}}
    batch = make_reward_batch(["7"], ["arithmetic"], ["7"], width=4)[:0]
    out = NaiveRewardManager(config=config, tokenizer=CharTokenizer()).compute_reward(batch)
    assert out.metrics["reward/overlong_penalty/mean"] == 0.0
    assert out.metrics["reward/overlong/ratio"] == 0.0


def embodied_batch(complete, embeddings=None, uid=None, task_id=None, mask_dtype=None):
    from siirl.data_coordinator import protocol

    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]],
                        dtype=mask_dtype or torch.float32)[:len(complete)]
    fields = {"response_mask": mask, "complete": torch.tensor(complete, dtype=torch.float32)}
    if embeddings is not None:
        fields["trajectory_embedding"] = torch.tensor(embeddings, dtype=torch.float32)
    batch = protocol.make_batch(fields)
    for key, values in (("uid", uid), ("task_id", task_id)):
        if values is not None:
            protocol.set_non_tensor(batch, key, values)
    return batch


def test_the_embodied_reward_coefficient_comes_from_reward_kwargs():
    from siirl.engine.reward_manager.embodied import EmbodiedRewardManager

    manager = EmbodiedRewardManager(config={"reward_model": {"reward_kwargs":
                                                             {"reward_coef": 2.0}}})
    out = manager.compute_reward(embodied_batch([1, 0, 1]))
    assert out.batch["token_level_scores"].sum(dim=-1).tolist() == [2.0, 0.0, 2.0]
    assert torch.equal(out.batch["token_level_rewards"], out.batch["token_level_scores"])
    assert out.metrics["reward/score/mean"] == pytest.approx(4 / 3)
    assert EmbodiedRewardManager(config={}).reward_coef == 1.0


def test_embodied_failures_are_compared_within_their_task_then_group_then_all():
    from siirl.engine.reward_manager.embodied import EmbodiedRewardManager

    complete, embeddings = [1, 0, 0], [[0, 1], [0.1, 1], [0.2, 1]]
    manager = EmbodiedRewardManager()

    def progress(**keys):
        out = manager.compute_reward(embodied_batch(complete, embeddings, **keys))
        return out.batch["token_level_scores"].sum(dim=-1).tolist()

    together = progress()  # one group, "all": both failures are compared with row 0
    assert together[0] == 1.0 and together[1] > 0 and together[2] > 0
    metrics = manager.compute_reward(embodied_batch(complete, embeddings)).metrics
    assert metrics["reward/progress/mean"] == pytest.approx((together[1] + together[2]) / 2)
    assert progress(uid=["g", "g", "g"]) == together
    apart = progress(uid=["g", "h", "h"])  # rows 1 and 2 have no success in their group
    assert apart == [1.0, 0.0, 0.0]
    assert progress(uid=["g", "h", "h"], task_id=["t", "t", "t"]) == together


def test_embodied_metrics_of_batches_without_failures_or_rows():
    from siirl.engine.reward_manager.embodied import EmbodiedRewardManager

    out = EmbodiedRewardManager().compute_reward(embodied_batch([1, 1], [[0, 1], [1, 1]]))
    assert out.metrics["reward/progress/mean"] == 0.0
    assert out.metrics["reward/success_rate"] == 1.0
    empty = EmbodiedRewardManager().compute_reward(embodied_batch([]))
    assert empty.metrics["reward/success_rate"] == 0.0
    assert empty.metrics["reward/score/mean"] == 0.0


def test_embodied_scores_keep_their_fraction_with_an_integer_mask_and_skip_empty_rows():
    from siirl.engine.reward_manager.embodied import EmbodiedRewardManager

    manager = EmbodiedRewardManager(reward_coef=0.5)
    out = manager.compute_reward(embodied_batch([1, 1, 0, 1], mask_dtype=torch.long))
    scores = out.batch["token_level_scores"]
    assert scores.dtype == torch.float32
    assert scores.sum(dim=-1).tolist() == [0.5, 0.5, 0.0, 0.0]  # row 3 has no token
