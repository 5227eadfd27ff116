"""What a plugin must provide for each role a DAGWorker runs.

An entry point in ``siirl.engines``, ``siirl.rollouts`` or ``siirl.reward_managers`` names a
factory ``factory(role: str, config: SiiRLArguments, worker: DAGWorker) -> engine`` (the
run's typed config, or its agent group's) whose result has the methods below; a factory
that names a ``peers`` keyword also gets the engines built before it (``{"actor": ...,
...}``: the actor is built first), so engines are wired explicitly; a factory attribute
``peer_roles = ("actor",)`` has the worker build that peer even for a graph without an
actor node. Optional, for the weight-sync step: an actor's
``weight_version`` and ``export_weights(bucket_bytes)``, a rollout's
``load_weights(buckets) -> bytes``.

Each method takes the batch (a TensorDict) and returns a NodeOutput
(siirl.dag_worker.data_structures). The DAGWorker's built-in node methods only delegate to
these, so a third-party engine is used exactly like ours.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from siirl.dag_worker.data_structures import NodeOutput


@runtime_checkable
class RolloutEngine(Protocol):
    """``siirl.rollouts``: sample responses for the batch's prompts."""

    def generate(self, batch: Any, validate: bool = False) -> NodeOutput: ...


@runtime_checkable
class RewardEngine(Protocol):
    """``siirl.reward_managers``: score responses into token-level rewards."""

    def compute_reward(self, batch: Any) -> NodeOutput: ...


@runtime_checkable
class RewardModelEngine(Protocol):
    """``siirl.engines`` for role ``reward_model`` (``reward_model.enable``): write each
    row's model score as ``rm_scores`` ([B, R], on its last response token) for the reward
    manager to add to the rule scores."""

    def compute_rm_score(self, batch: Any) -> NodeOutput: ...


@runtime_checkable
class ActorEngine(Protocol):
    """``siirl.engines`` for role ``actor``: log-probs and policy updates."""

    def compute_log_prob(self, batch: Any) -> NodeOutput: ...

    def update_policy(self, batch: Any) -> NodeOutput: ...


@runtime_checkable
class ReferenceEngine(Protocol):
    """``siirl.engines`` for role ``reference``: frozen-policy log-probs."""

    def compute_ref_log_prob(self, batch: Any) -> NodeOutput: ...


@runtime_checkable
class CriticEngine(Protocol):
    """``siirl.engines`` for role ``critic``: values and value-function updates."""

    def compute_values(self, batch: Any) -> NodeOutput: ...

    def update_critic(self, batch: Any) -> NodeOutput: ...


ROLE_PROTOCOLS = {
    "rollout": RolloutEngine,
    "reward": RewardEngine,
    "reward_model": RewardModelEngine,
    "actor": ActorEngine,
    "reference": ReferenceEngine,
    "critic": CriticEngine,
}
