"""The advantage node of a multi-agent workflow: advantages for every agent group.

``algorithm.adv_estimator=gae_marft`` (MARFT) takes the agents' responses of an episode as
one sequence (agent 0's reply, then agent 1's, ...) and runs GAE across them with each
agent's critic values; an agent without rewards of its own (no reward node of its group)
gets zeros and its credit through the next agent's value. Any other estimator runs per
agent on that agent's rows, and an agent without rewards of its own gets the team's: the
episode's score on its own last response token.
"""

from __future__ import annotations

from typing import Any, Dict

import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.dag_worker.multi_agent.agent_groups import prefix
from siirl.dag_worker.nodes import algorithm as algorithm_nodes
from siirl.data_coordinator.fields import (
    ADVANTAGES,
    RESPONSE_MASK,
    RETURNS,
    TOKEN_LEVEL_REWARDS,
    VALUES,
)
from siirl.errors import ConfigError


def _field(batch: Any, group: int, name: str) -> Any:
    key = prefix(group) + name
    return batch.get(key) if key in batch.keys() else None


def _last_token_rewards(mask: torch.Tensor, per_row: torch.Tensor) -> torch.Tensor:
    """``per_row`` placed on each row's last response token."""
    out = torch.zeros_like(mask, dtype=torch.float32)
    lengths = mask.sum(dim=-1).long()
    rows = torch.nonzero(lengths > 0).flatten()
    out[rows, lengths[rows] - 1] = per_row[rows].to(out.dtype)
    return out


def _rewards_per_agent(batch: Any, groups: list, zeros_if_missing: bool) -> Dict[int, Any]:
    rewarded = [g for g in groups if _field(batch, g, TOKEN_LEVEL_REWARDS) is not None]
    if not rewarded:
        raise ConfigError("the multi-agent advantage node found no rewards: a reward node "
                          "(node_role REWARD) of some agent group must run before it")
    team = _field(batch, rewarded[-1], TOKEN_LEVEL_REWARDS).sum(dim=-1)
    rewards = {}
    for g in groups:
        own = _field(batch, g, TOKEN_LEVEL_REWARDS)
        mask = _field(batch, g, RESPONSE_MASK)
        if own is not None:
            rewards[g] = own
        elif zeros_if_missing:
            rewards[g] = torch.zeros_like(mask, dtype=torch.float32)
        else:
            rewards[g] = _last_token_rewards(mask, team)
    return rewards


def compute_agents_advantage(worker: Any, batch: Any, config: Any,
                             node: Any = None) -> NodeOutput:
    """Every agent group's advantages, with batch statistics (whitening) over every
    worker's rows of that agent (``core_algos.batch_reduction.reduction_for``)."""
    from siirl.dag_worker import core_algos
    from siirl.dag_worker.core_algos.batch_reduction import reduction_for

    agents = worker.agents
    groups = list(agents.ids)
    if config.algorithm.use_kl_in_reward:
        raise ConfigError("algorithm.use_kl_in_reward is not supported in multi-agent "
                          "workflows; use actor_rollout_ref.actor.use_kl_loss=true")
    name = config.algorithm.adv_estimator
    metrics: Dict[str, Any] = {}
    batch = batch.clone(recurse=False)
    reduction = reduction_for(worker, node)
    if name == "gae_marft":
        missing = [g for g in groups if _field(batch, g, VALUES) is None]
        if missing:
            raise ConfigError(f"algorithm.adv_estimator=gae_marft needs every agent's values: "
                              f"agent groups {missing} have no critic value node before the "
                              "advantage node")
        rewards = _rewards_per_agent(batch, groups, zeros_if_missing=True)
        estimator = core_algos.get_adv_estimator_fn(name)
        advantages, returns = estimator(
            [rewards[g] for g in groups], [_field(batch, g, VALUES) for g in groups],
            [_field(batch, g, RESPONSE_MASK) for g in groups],
            float(config.algorithm.gamma), float(config.algorithm.lam), reduction)
        for g, adv, ret in zip(groups, advantages, returns, strict=True):
            batch.set(prefix(g) + ADVANTAGES, adv)
            batch.set(prefix(g) + RETURNS, ret)
            batch.set(prefix(g) + TOKEN_LEVEL_REWARDS, rewards[g])
            metrics.update(algorithm_nodes.advantage_metrics(
                adv, ret, _field(batch, g, RESPONSE_MASK), reduction,
                prefix=f"agent_group_{g}/"))
        return NodeOutput(batch=batch, metrics=metrics)
    rewards = _rewards_per_agent(batch, groups, zeros_if_missing=False)
    for g in groups:
        batch.set(prefix(g) + TOKEN_LEVEL_REWARDS, rewards[g])
        view = agents.view(batch, g)
        out = algorithm_nodes.compute_advantage(worker, view, agents.configs[g],
                                                reduction=reduction)
        batch.set(prefix(g) + ADVANTAGES, out.batch[ADVANTAGES])
        batch.set(prefix(g) + RETURNS, out.batch[RETURNS])
        metrics.update(agents.metric_names(g, out.metrics))
    return NodeOutput(batch=batch, metrics=metrics)
