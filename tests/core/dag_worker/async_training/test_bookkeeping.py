"""The numbers and books of asynchronous training: the staleness bound, the prompt
ledger, and the trainer's queue of groups (staleness drop, checkpoint state)."""

import io

import pytest
import torch

from siirl.dag_worker.async_training.group_queue import GroupQueue, batch_of, split_groups
from siirl.dag_worker.async_training.prompt_ledger import PromptLedger
from siirl.dag_worker.async_training.shape import AsyncShape
from siirl.data_coordinator.fields import POLICY_VERSION, SAMPLE_ID
from siirl.data_coordinator.protocol import get_non_tensor, make_batch
from siirl.errors import ConfigError


def _shape(k=1, s=0.0, trainers=1, gen=32):
    return AsyncShape(trainers, 1, 32, k, s, gen)


@pytest.mark.parametrize("k, s, lag", [(1, 0.0, 0), (1, 0.5, 1), (1, 1.0, 1), (2, 1.0, 3),
                                       (1, 2.0, 2), (3, 0.0, 2)])
def test_the_lag_bound_is_k_times_ceil_s_plus_one_minus_one(k, s, lag):
    assert _shape(k, s).max_lag == lag


def test_the_rollout_runs_ahead_by_one_plus_s_syncs_of_prompts():
    shape = _shape(k=2, s=0.5)
    assert shape.prompts_per_sync == 64 and shape.outstanding_limit == 96


def test_shapes_that_cannot_run_are_refused_with_the_keys():
    with pytest.raises(ConfigError, match="trainer workers"):
        _shape(trainers=3).check()
    with pytest.raises(ConfigError, match="data.gen_batch_size=64"):
        _shape(gen=64).check()


def test_the_ledger_keeps_done_prompts_as_intervals():
    ledger = PromptLedger()
    ledger.add([0, 1, 2, 5, 6, 3])
    assert ledger.state() == [(0, 4), (5, 7)] and ledger.first_missing() == 4
    assert 4 not in ledger and 5 in ledger and 7 not in ledger
    ledger.add([4])
    assert ledger.state() == [(0, 7)] and ledger.count() == 7
    other = PromptLedger([(10, 12)])
    assert ledger.union(other).state() == [(0, 7), (10, 12)]
    assert PromptLedger([(3, 5)]).first_missing() == 0


def _rows(sample_ids, version, n=2):
    ids = [i for i in sample_ids for _ in range(n)]
    return make_batch({SAMPLE_ID: torch.tensor(ids),
                       POLICY_VERSION: torch.full((len(ids),), version),
                       "input_ids": torch.ones(len(ids), 3, dtype=torch.long)},
                      {"uid": [str(i) for i in ids],
                       "reward_model": [{"ground_truth": str(i)} for i in ids]})


def test_the_queue_drops_groups_beyond_the_lag_bound_and_saves_plain_values():
    queue = GroupQueue()
    queue.put(split_groups(_rows([0, 1], version=0), {"timing_s/rollout": 1.0}))
    queue.put(split_groups(_rows([2, 3, 4], version=2), {"timing_s/rollout": 2.0}))
    fresh, stale, _ = queue.take(2, version=3, max_lag=1, senders=1)
    assert [g.sample_id for g in stale] == [0, 1]  # lag 3 > 1: never trained
    assert [g.sample_id for g in fresh] == [2, 3] and len(queue) == 1
    assert batch_of(fresh, 0)[SAMPLE_ID].tolist() == [2, 2, 3, 3]
    buffer = io.BytesIO()
    torch.save(queue.state(), buffer)
    buffer.seek(0)
    restored = GroupQueue()
    restored.load(torch.load(buffer, weights_only=True))
    (group,), _, _ = restored.take(1, version=2, max_lag=0, senders=1)
    assert group.sample_id == 4 and group.version == 2
    assert get_non_tensor(group.rows, "reward_model") == [{"ground_truth": "4"}] * 2


def test_a_queue_whose_senders_ended_says_so_instead_of_waiting():
    queue = GroupQueue()
    queue.close_one()
    with pytest.raises(RuntimeError, match="ended before"):
        queue.take(1, version=0, max_lag=0, senders=1)


def test_a_restored_group_dropped_as_stale_is_generated_again_by_one_rollout_worker():
    from collections import deque
    from types import SimpleNamespace

    from siirl.dag_worker.async_training.rollout_side import AsyncRollout, adopted

    queued = [40, 41, 42, 43]  # in a trainer's queue at the checkpoint
    assert sorted(adopted(queued, 0, 2) + adopted(queued, 1, 2)) == queued  # one owner each
    again = []
    for place in (0, 1):
        config = SimpleNamespace(algorithm=SimpleNamespace(
            filter_groups=SimpleNamespace(enable=False)))
        groups = SimpleNamespace(rollouts=[5, 6], rank=5 + place)
        rollout = AsyncRollout(SimpleNamespace(config=config), groups, _shape())
        rollout.feed = SimpleNamespace(again=deque())
        rollout.outstanding.update(adopted(queued, place, 2))
        rollout._apply({"version": 5, "trained": [40], "dropped": [41, 42]}, [])
        again += list(rollout.feed.again)
    assert sorted(again) == [41, 42]  # generated again, each once; 43 still outstanding
