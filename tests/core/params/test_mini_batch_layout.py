"""The loader's chunk count: one chunk per step's smallest common run of the actor's and a
training critic's PPO mini-batches (siirl.params.mini_batch_layout)."""

import pytest

from siirl.params.mini_batch_layout import loader_mini_batches, loader_ranks

A = "actor_rollout_ref.actor"


def _config(batch=16, actor=4, critic=None, estimator="grpo", enable=None, algorithm=()):
    return {"data": {"train_batch_size": batch},
            "algorithm": {"adv_estimator": estimator, **dict(algorithm)},
            "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": actor}},
            "critic": {"ppo_mini_batch_size": critic if critic is not None else actor,
                       "enable": enable}}


@pytest.mark.parametrize("config,chunks", [
    (_config(), 4),  # 16 prompts in mini-batches of 4
    (_config(actor=16), 1),  # one mini-batch: the plain slices
    (_config(actor=4, critic=8), 4),  # no critic trains under GRPO: the actor's size
    (_config(actor=4, critic=8, estimator="gae"), 4),  # the critic's 8 are runs of 4
    (_config(actor=8, critic=2, estimator="gae"), 8),  # the actor's 8 are runs of 2
    (_config(batch=24, actor=8, critic=12, estimator="gae"), 6),  # gcd 4
    (_config(actor=4, critic=2, estimator="gae", enable=False), 4),  # critic.enable wins
    (_config(actor=4, critic=2, enable=True), 8),
    (_config(actor=3), 1),  # does not divide the batch: refused elsewhere, no layout here
    (_config(algorithm={"filter_groups": {"enable": True}}), 1),  # dynamic sampling
])
def test_chunks(config, chunks):
    assert loader_mini_batches(config) == chunks


def test_loader_ranks_are_the_rollout_groups():
    trainer = {"nnodes": 2, "n_gpus_per_node": 4}
    rollout = {"tensor_model_parallel_size": 2}
    assert loader_ranks({"trainer": trainer}) == 8
    assert loader_ranks({"trainer": trainer, "actor_rollout_ref": {"rollout": rollout}}) == 4
    assert loader_ranks({"trainer": {"nnodes": 1, "n_gpus_per_node": 3},
                         "actor_rollout_ref": {"rollout": rollout}}) is None
