"""DAPO dynamic sampling and the embodied success-rate filter."""

import pytest
import torch

from siirl.dag_worker.nodes.dapo_filter import dynamic_sampling
from siirl.dag_worker.nodes.embodied_filter import embodied_local_rank_sampling
from siirl.data_coordinator.protocol import get_non_tensor, make_batch
from siirl.errors import DataError

ENABLED = {"algorithm": {"filter_groups": {"enable": True}}}


def _dapo_batch():
    # groups: g1 all right, g2 mixed, g3 all wrong, g4 a single sample
    uids = ["g1", "g1", "g2", "g2", "g3", "g3", "g4"]
    acc = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    rewards = torch.zeros(7, 3)
    rewards[:, -1] = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    rewards[1, 0] = 0.5  # g1 has different final rewards
    return make_batch({"acc": acc, "token_level_rewards": rewards,
                       "row": torch.arange(7)}, {"uid": uids})


def test_dapo_metric_field_drops_zero_variance_groups():
    config = {"algorithm": {"filter_groups": {"enable": True, "metric": "acc"}}}
    out = dynamic_sampling(_dapo_batch(), config)
    assert get_non_tensor(out.batch, "uid") == ["g2", "g2", "g4"]
    assert out.batch["row"].tolist() == [2, 3, 6]
    assert out.metrics == {"dynamic_sampling/total": 4.0, "dynamic_sampling/kept": 2.0,
                           "dynamic_sampling/kept_ratio": 0.5}


def test_dapo_default_metric_is_seq_final_reward():
    out = dynamic_sampling(_dapo_batch(), ENABLED)
    # final rewards: g1 [1.5, 1.0] varies, g2 [1, 0] varies, g3 [0, 0] does not
    assert get_non_tensor(out.batch, "uid") == ["g1", "g1", "g2", "g2", "g4"]
    assert out.metrics["dynamic_sampling/kept"] == 3.0


def test_dapo_disabled_passes_everything():
    batch = _dapo_batch()
    for config in (None, {"algorithm": {"filter_groups": {"enable": False, "metric": "acc"}}}):
        out = dynamic_sampling(batch, config)
        assert out.batch is batch
        assert out.metrics["dynamic_sampling/total"] == 4.0


def test_dapo_all_groups_dropped_gives_empty_batch():
    batch = make_batch({"token_level_rewards": torch.ones(4, 2)}, {"uid": ["a", "a", "b", "b"]})
    out = dynamic_sampling(batch, ENABLED)
    assert out.batch.batch_size == torch.Size([0])
    assert out.metrics["dynamic_sampling/kept_ratio"] == 0.0


def test_dapo_non_tensor_metric():
    batch = make_batch({"x": torch.arange(4)},
                       {"uid": ["a", "a", "b", "b"], "score_list": [1, 1, 0, 1]})
    config = {"algorithm": {"filter_groups": {"enable": True, "metric": "score_list"}}}
    assert dynamic_sampling(batch, config).batch["x"].tolist() == [2, 3]


def test_dapo_missing_metric_field():
    config = {"algorithm": {"filter_groups": {"enable": True, "metric": "nonexistent"}}}
    with pytest.raises(DataError, match="nonexistent"):
        dynamic_sampling(_dapo_batch(), config)


def _embodied_batch():
    complete = [1, 1, 1, 1,  # mean 1.0: dropped
                1, 0, 0, 0,  # 0.25: kept
                0, 0, 0, 0,  # 0.0: dropped
                1, 1, 0, 0]  # 0.5: kept
    uids = [f"t{i // 4}" for i in range(16)]
    return make_batch({"complete": torch.tensor(complete, dtype=torch.bool),
                       "response_mask": torch.ones(16, 3), "row": torch.arange(16)},
                      {"uid": uids})


def _trained(out):
    """The rows the loss still sees (response mask not all 0)."""
    return out.batch["response_mask"].sum(dim=1).gt(0).nonzero().flatten().tolist()


def test_embodied_keeps_groups_inside_bounds():
    batch = _embodied_batch()
    out = embodied_local_rank_sampling(batch, None)
    # filtered groups stay (every worker keeps its row count) but train on nothing
    assert out.batch["row"].tolist() == list(range(16))
    assert _trained(out) == [4, 5, 6, 7, 12, 13, 14, 15]
    assert batch["response_mask"].sum() == 48  # the input batch is not changed
    assert out.metrics["embodied_sampling/total"] == 4.0
    assert out.metrics["embodied_sampling/kept"] == 2.0
    assert out.metrics["embodied_sampling/success_rate"] == pytest.approx(7 / 16)


def test_embodied_bounds_are_inclusive():
    complete = [1] + [0] * 9 + [1] * 9 + [0]  # group means 0.1 and 0.9
    uids = ["low"] * 10 + ["high"] * 10
    batch = make_batch({"complete": torch.tensor(complete, dtype=torch.float32),
                        "response_mask": torch.ones(20, 2)}, {"uid": uids})
    out = embodied_local_rank_sampling(batch, {})
    assert out.batch["response_mask"].sum() == 40


def test_embodied_custom_bounds_and_disable():
    config = {"algorithm": {"embodied_sampling": {"accuracy_lower_bound": 0.0,
                                                  "accuracy_upper_bound": 0.3}}}
    out = embodied_local_rank_sampling(_embodied_batch(), config)
    assert _trained(out) == list(range(4, 12))  # groups t1 and t2

    batch = _embodied_batch()
    off = {"algorithm": {"embodied_sampling": {"filter_accuracy": False}}}
    out = embodied_local_rank_sampling(batch, off)
    assert out.batch is batch and out.metrics["embodied_sampling/kept"] == 2.0


class _Worker:
    """What dynamic_sampling reads of a DAGWorker: its step scratch space, its share of
    the batch, its tokenizer and the (single-worker) communicator."""

    def __init__(self, share):
        from types import SimpleNamespace

        from siirl.dag_worker.walk.collective import WorkerComm

        self.step_state = {}
        self.train_loader = SimpleNamespace(batch_size=share)
        self.tokenizer = SimpleNamespace(pad_token_id=0)
        self.comm = WorkerComm()


def _config(**settings):
    # one worker's step: 3 prompt groups (data.train_batch_size over one loader rank)
    return {"algorithm": {"filter_groups": {"enable": True, "metric": "acc", **settings}},
            "data": {"train_batch_size": 3}}


def _prompt_batch(tag, width):
    # two groups (one informative), prompt-side fields padded to ``width``
    batch = _dapo_batch()
    rows = batch.batch_size[0]
    batch.set("input_ids", torch.ones(rows, width, dtype=torch.long))
    batch.set("attention_mask", torch.ones(rows, width, dtype=torch.long))
    from siirl.data_coordinator.protocol import set_non_tensor
    set_non_tensor(batch, "uid", [f"{tag}{u}" for u in get_non_tensor(batch, "uid")])
    return batch


def test_dapo_regenerates_until_enough_groups_then_cuts_to_the_share():
    worker, config = _Worker(share=3), _config()
    first = dynamic_sampling(_prompt_batch("a", 4), config, worker=worker)
    assert first.info == {"regenerate": True} and first.batch is None  # 2 of 3 groups
    second = dynamic_sampling(_prompt_batch("b", 6), config, worker=worker)
    assert not second.info.get("regenerate")
    assert get_non_tensor(second.batch, "uid") == ["ag2", "ag2", "ag4", "bg2", "bg2"]
    assert second.batch["input_ids"].shape == (5, 6)  # earlier prompts left-padded
    assert second.batch["attention_mask"][:3, :2].sum() == 0
    assert second.metrics["dynamic_sampling/num_gen_batches"] == 2.0


def test_dapo_rounds_of_gen_batch_size_fill_the_train_batch_share():
    """verl's data.gen_batch_size: the loader's rounds are larger than the step's share of
    data.train_batch_size (2 workers: 4 groups of 8), which is what the pool is cut to."""
    worker = _Worker(share=6)
    worker.train_loader.num_ranks = 2
    config = {**_config(), "data": {"train_batch_size": 8}}
    first = dynamic_sampling(_prompt_batch("a", 4), config, worker=worker)
    assert first.info == {"regenerate": True}  # 2 groups of the 4 needed
    second = dynamic_sampling(_prompt_batch("b", 4), config, worker=worker)
    assert not second.info.get("regenerate")
    assert len(set(get_non_tensor(second.batch, "uid"))) == 4


def test_dapo_exhausted_generations_error_or_warn():
    with pytest.raises(DataError, match="max_num_gen_batches=1"):
        dynamic_sampling(_prompt_batch("a", 4), _config(max_num_gen_batches=1),
                         worker=_Worker(share=3))
    out = dynamic_sampling(_prompt_batch("a", 4),
                           _config(max_num_gen_batches=1, on_exhausted="warn"),
                           worker=_Worker(share=3))
    assert get_non_tensor(out.batch, "uid") == ["ag2", "ag2", "ag4"]


def test_dapo_step_totals_count_every_generation_batch():
    # the per-batch keys keep describing the last batch; step_groups adds up the step's
    worker, config = _Worker(share=3), _config()
    first = dynamic_sampling(_prompt_batch("a", 4), config, worker=worker)
    second = dynamic_sampling(_prompt_batch("b", 6), config, worker=worker)
    for key in ("total", "kept"):
        per_batch = [out.metrics[f"dynamic_sampling/{key}"] for out in (first, second)]
        assert second.metrics[f"dynamic_sampling/step_groups/{key}"] == sum(per_batch)
    assert second.metrics["dynamic_sampling/step_groups/total"] == 8.0
    assert second.metrics["dynamic_sampling/step_groups/kept"] == 4.0
    worker.step_state = {}  # a new step starts from zero
    third = dynamic_sampling(_prompt_batch("c", 4), config, worker=worker)
    assert third.metrics["dynamic_sampling/step_groups/total"] == 4.0
