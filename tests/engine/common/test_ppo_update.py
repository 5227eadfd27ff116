"""The shared PPO update loop (``siirl.engine.common.ppo_update``) on a fake backend: the
batch arithmetic, epochs x mini-batches steps, skipped non-finite steps, resumable
shuffling, and that the actor and the critic both run it."""

import math
from collections import defaultdict

import pytest
import torch

from siirl.data_coordinator.protocol import make_batch
from siirl.engine.actor.dp_actor import DataParallelPPOActor
from siirl.engine.common.backend import Head
from siirl.engine.common.ppo_update import PPOUpdater, UpdateSettings
from siirl.engine.critic.dp_critic import DataParallelPPOCritic
from siirl.errors import ConfigError
from siirl.params import ActorArguments, CriticArguments


class FakeBackend:
    """A scalar model; records the rows of every micro-batch and every optimizer step."""

    def __init__(self, bad_steps=()):
        self.module = torch.nn.Linear(1, 1, bias=False)
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
        self.device, self.dp_rank, self.dp_size, self.dp_group = torch.device("cpu"), 0, 1, None
        self.micro_rows, self.steps, self.bad_steps = [], 0, set(bad_steps)
        self.calls = 0

    def forward_backward_batch(self, data, micro_rows, head, loss_fn=None, forward_only=False):
        for start in range(0, data.batch_size[0], micro_rows):
            micro = data[start:start + micro_rows]
            self.micro_rows.append(micro["x"].tolist())
            loss_fn(micro, head.fn(self.module, micro)).backward()

    def zero_grad(self):
        self.optimizer.zero_grad(set_to_none=True)

    def optimizer_step(self):
        self.calls += 1
        if self.calls in self.bad_steps:
            self.zero_grad()
            return float("nan")
        self.steps += 1
        self.optimizer.step()
        return 1.0

    def share_metrics(self, metrics):
        return metrics


HEAD = Head(lambda module, micro: {"y": module(micro["x"][:, None].float())[:, 0]}, ("y",))


class MeanLoss:
    def bind(self, mini_batch, num_micro, totals):
        def loss(micro, outputs):
            totals["fake/loss"] += float(outputs["y"].detach().mean()) / num_micro
            return outputs["y"].mean() / num_micro
        return loss


def rows(n):
    return make_batch({"x": torch.arange(n)})


def test_epochs_times_mini_batches_steps_with_micro_batches():
    backend = FakeBackend()
    settings = UpdateSettings(mini_batch_prompts=2, micro_batch_rows=2, epochs=2, rollout_n=2)
    updater = PPOUpdater(backend, settings, "fake")
    metrics = updater.update(rows(8), HEAD, MeanLoss())
    assert backend.steps == 4  # 2 epochs x (8 rows / 4-row mini-batches)
    assert backend.micro_rows[:2] == [[0, 1], [2, 3]]  # 2 micro-batches per mini-batch
    assert updater.update_count == 1 and metrics["fake/skipped_steps"] == 0.0
    assert metrics["fake/grad_norm"] == 1.0 and metrics["fake/lr"] == pytest.approx(0.1)


def test_a_non_finite_step_is_skipped_and_counted():
    backend = FakeBackend(bad_steps={1})
    updater = PPOUpdater(backend, UpdateSettings(2, 0, rollout_n=2), "fake")
    metrics = updater.update(rows(8), HEAD, MeanLoss())
    assert backend.steps == 1 and metrics["fake/skipped_steps"] == 1.0
    backend = FakeBackend(bad_steps={1, 2})
    metrics = PPOUpdater(backend, UpdateSettings(2, 0, rollout_n=2), "fake").update(
        rows(8), HEAD, MeanLoss())
    assert math.isnan(metrics["fake/grad_norm"])  # every step skipped


def test_shuffle_is_seeded_by_the_update_count():
    def order(update_count):
        backend = FakeBackend()
        updater = PPOUpdater(backend, UpdateSettings(4, 0, shuffle=True, seed=3), "fake")
        updater.update_count = update_count
        updater.update(rows(8), HEAD, MeanLoss())
        return backend.micro_rows

    assert order(5) == order(5)  # a resumed run shuffles like an uninterrupted one
    assert order(5) != order(6)


def test_batch_arithmetic_is_checked_with_the_key_names():
    with pytest.raises(ConfigError, match="multiple of critic.ppo_micro_batch_size_per_gpu"):
        UpdateSettings(4, 3, key_prefix="critic.").micro_rows()
    with pytest.raises(ConfigError, match="smaller than the data-parallel size 8"):
        UpdateSettings(1, 0, rollout_n=2, world_size=8).mini_batch_rows()
    with pytest.raises(ConfigError, match="ppo_epochs=0"):
        UpdateSettings(1, 0, epochs=0)


def test_actor_and_critic_run_the_same_update_loop():
    settings = UpdateSettings(2, 0)
    actor = DataParallelPPOActor(FakeBackend(), ActorArguments(), lambda *a: HEAD,
                                 settings=settings)
    critic = DataParallelPPOCritic(FakeBackend(), CriticArguments(ppo_mini_batch_size=2,
                                                                  ppo_epochs=1, shuffle=False,
                                                                  loss_agg_mode="token-mean",
                                                                  rollout_n=1),
                                   lambda length: HEAD, settings)
    assert type(actor.updater) is PPOUpdater and type(critic.updater) is PPOUpdater
    # neither role has a loop of its own to drift from the shared one
    for role in (DataParallelPPOActor, DataParallelPPOCritic):
        assert not {"_update_mini_batch", "_finish_mini_batch"} & set(vars(role))


def test_metric_totals_are_averaged_over_mini_batches():
    backend = FakeBackend()
    seen = defaultdict(list)

    class Recording(MeanLoss):
        def bind(self, mini_batch, num_micro, totals):
            seen["rows"].append(mini_batch.batch_size[0])
            return super().bind(mini_batch, num_micro, totals)

    PPOUpdater(backend, UpdateSettings(4, 2), "fake").update(rows(8), HEAD, Recording())
    assert seen["rows"] == [4, 4]


def test_turn_rows_are_cut_into_a_count_of_mini_batches():
    """AGENTIC step rows (as many as the episodes took turns): the update takes the same
    optimizer steps whatever their count, so 1 and N workers step alike."""
    from siirl.engine.common.update_settings import turn_row_mini_batches
    from siirl.params import SiiRLArguments

    for count, expected in ((11, [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]),
                            (3, [[0, 1], [2]])):
        backend = FakeBackend()
        settings = UpdateSettings(2, 0, rollout_n=4, mini_batches=2)
        PPOUpdater(backend, settings, "fake").update(rows(count), HEAD, MeanLoss())
        assert backend.micro_rows == expected and backend.steps == 2
    backend = FakeBackend()  # micro-batches of a fixed size, the last one smaller
    PPOUpdater(backend, UpdateSettings(2, 4, rollout_n=4, mini_batches=1), "fake").update(
        rows(10), HEAD, MeanLoss())
    assert [len(m) for m in backend.micro_rows] == [4, 4, 2] and backend.steps == 1

    config = SiiRLArguments()
    config.data.train_batch_size = 8
    assert turn_row_mini_batches(config, 4) == 0  # DEFAULT: rows are samples
    config.algorithm.workflow_type = "AGENTIC"
    assert turn_row_mini_batches(config, 4) == 0  # trajectory rows: one per episode
    config.env_manager.mode = "step"
    assert turn_row_mini_batches(config, 4) == 2 and turn_row_mini_batches(config, 8) == 1
