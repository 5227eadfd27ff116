"""The embodied reward manager's kinds. reward=coin_flip (the EMBODIED learning control): every
episode is paid by a fair coin that depends on the seed, the step and its place in its
group, never on what it did (success, failure, truncation, video embeddings); and reward=env, the
environment's own rewards summed per episode."""

from types import SimpleNamespace

import pytest
import torch

from siirl.data_coordinator import protocol
from siirl.engine.reward_manager.embodied import EmbodiedRewardManager
from siirl.errors import ConfigError, DataError

GROUPS, N = 25, 8


def _manager(seed=3, step=1, reward="coin_flip"):
    config = {"reward_model": {"reward_kwargs": {"reward": reward}}, "trainer": {"seed": seed}}
    return EmbodiedRewardManager(config=config, worker=SimpleNamespace(global_step=step))


def _batch(complete, embeddings=False):
    rows = len(complete)
    fields = {"response_mask": torch.ones(rows, 4),
              "complete": torch.tensor(complete, dtype=torch.float32)}
    if embeddings:
        fields["trajectory_embedding"] = torch.randn(rows, 3)
    batch = protocol.make_batch(fields)
    protocol.set_non_tensor(batch, "uid", [str(i // N) for i in range(rows)])
    return batch


def _paid(manager, batch):
    return manager.compute_reward(batch).batch["token_level_scores"].sum(-1)


def test_the_coin_ignores_what_the_episodes_did():
    rows = GROUPS * N
    successes = _paid(_manager(), _batch([1.0] * rows, embeddings=True))
    failures = _paid(_manager(), _batch([0.0] * rows))  # failed or ran out of steps alike
    assert torch.equal(successes, failures)
    assert set(successes.tolist()) == {0.0, 1.0}
    # a fair coin: 200 flips land within 4.5 standard deviations of half
    assert abs(successes.mean().item() - 0.5) < 4.5 * (0.25 / rows) ** 0.5


def test_the_coin_is_seeded_by_run_seed_and_step():
    batch = [0.0, 1.0] * (GROUPS * N // 2)
    first = _paid(_manager(), _batch(batch))
    assert torch.equal(first, _paid(_manager(), _batch(batch)))
    assert not torch.equal(first, _paid(_manager(step=2), _batch(batch)))
    assert not torch.equal(first, _paid(_manager(seed=4), _batch(batch)))


def test_env_pays_the_environments_summed_rewards_and_needs_them():
    batch = _batch([1.0, 0.0, 0.0])
    batch.set("env_scores", torch.tensor([1.6, 0.25, -0.3]))
    paid = _paid(_manager(reward="env"), batch)
    assert paid.tolist() == pytest.approx([1.6, 0.25, -0.3])
    with pytest.raises(DataError, match="env_scores"):
        _paid(_manager(reward="env"), _batch([1.0, 0.0]))


def test_success_stays_the_default_and_other_rewards_are_refused():
    assert _paid(_manager(reward="success"), _batch([1.0, 0.0])).tolist() == [1.0, 0.0]
    with pytest.raises(ConfigError, match="reward_kwargs.reward='coin'"):
        _manager(reward="coin")
