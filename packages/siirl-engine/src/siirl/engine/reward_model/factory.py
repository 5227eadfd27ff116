"""Building the ``reward_model`` engine (reached through the ``fsdp`` plugin of
``siirl.engines`` for role ``reward_model``, as ``reward_model.strategy=fsdp`` names it).

``reward_model.style=discriminative`` (the default): the sequence classifier of
``reward_model.model.path``, frozen; with several workers it is sharded with FSDP2 over the
role's workers like the reference policy (``fsdp_config.fsdp_size=-1``), or held whole by
each (``fsdp_size=1``). ``generative``: the judge (``judge``), replying through the actor's
rollout engine or through a causal LM of its own.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from siirl.engine.common.config import typed_config
from siirl.engine.common.runtime import (
    data_parallel_world,
    process_group,
    resolve_device,
    should_shard,
)
from siirl.engine.fsdp.backend import FSDPBackend, compute_dtype
from siirl.engine.fsdp.sharding import replicates, shard_fsdp2
from siirl.engine.reward_model.engine import RewardModelEngine
from siirl.engine.reward_model.judge import GenerativeJudge
from siirl.engine.reward_model.loading import load_causal_lm, load_classifier
from siirl.errors import ConfigError

STYLES = ("discriminative", "generative")
JUDGE_SOURCES = ("rollout", "model")


def input_tokenizer(cfg: Any, peers: Mapping[str, Any]) -> Optional[Any]:
    """The tokenizer of the batch's ids: ``reward_model.model.input_tokenizer`` when set
    (verl's key), else the actor engine's."""
    path = cfg.reward_model.model.input_tokenizer
    if path:
        from siirl.engine.models.loader import load_tokenizer as load_policy_tokenizer

        try:  # the policy's own names (builtin:tiny-arith, smollm2, ...) work here too
            return load_policy_tokenizer({"path": path})
        except ConfigError as err:
            raise ConfigError(f"reward_model.model.input_tokenizer={path!r}: {err}") from None
    return getattr(peers.get("actor"), "tokenizer", None)


def discriminative(cfg: Any, worker: Any, peers: Mapping[str, Any]) -> RewardModelEngine:
    model_cfg = cfg.reward_model.model
    module, tokenizer = load_classifier(model_cfg, resolve_device(cfg))
    group = process_group(worker, "reward_model")
    # frozen: a model held whole by every worker (fsdp_size=1) needs no communication
    sharded = should_shard(group) and not replicates(
        model_cfg.fsdp_config.fsdp_size, torch.distributed.get_world_size(group),
        "reward_model.model.fsdp_config.fsdp_size")
    if sharded:
        shard_fsdp2(module, model_cfg.fsdp_config.reshard_after_forward, group)
    rank, world_size = data_parallel_world(worker)
    backend = FSDPBackend(module, dp_rank=rank, dp_size=world_size, dp_group=group,
                          sharded=sharded,
                          autocast_dtype=compute_dtype(model_cfg.fsdp_config.model_dtype))
    return RewardModelEngine(cfg, backend, tokenizer, input_tokenizer(cfg, peers))


def generative(cfg: Any, worker: Any, peers: Mapping[str, Any]) -> GenerativeJudge:
    source = str(cfg.reward_model.judge.source)
    if source not in JUDGE_SOURCES:
        raise ConfigError(f"reward_model.judge.source={source!r} is not one of "
                          f"{', '.join(JUDGE_SOURCES)}: 'rollout' asks the actor's rollout "
                          "engine, 'model' a causal LM loaded from reward_model.model.path")
    actor_tokenizer = input_tokenizer(cfg, peers)
    if source == "model":
        from siirl.engine.rollout.hf_rollout import HFRollout

        module, tokenizer = load_causal_lm(cfg.reward_model.model, resolve_device(cfg))
        rollout = HFRollout(role="reward_model", config=cfg, worker=worker, module=module,
                            tokenizer=tokenizer)
        return GenerativeJudge(cfg, rollout, tokenizer, actor_tokenizer)
    rollout = peers.get("rollout")
    if rollout is None:
        raise ConfigError("reward_model.style=generative with reward_model.judge.source="
                          "rollout asks the actor's rollout engine, but this worker has none "
                          "(its graph has no rollout node): set reward_model.judge.source="
                          "model and reward_model.model.path to the judge's model")
    if actor_tokenizer is None:
        raise ConfigError("reward_model.style=generative with reward_model.judge.source="
                          "rollout writes the judge's prompts with the actor's tokenizer, but "
                          "this worker has no actor engine: set "
                          "reward_model.model.input_tokenizer to the policy's path")
    return GenerativeJudge(cfg, rollout, actor_tokenizer, actor_tokenizer)


def fsdp_reward_model(config: Any, worker: Any = None,
                      peers: Optional[Mapping[str, Any]] = None) -> Any:
    """The engine of role ``reward_model`` for ``reward_model.style``; ``peers`` are the
    worker's engines built before it (the actor's tokenizer, the rollout engine)."""
    cfg = typed_config(config)
    style = str(cfg.reward_model.style)
    if style not in STYLES:
        raise ConfigError(f"reward_model.style={style!r} is not one of {', '.join(STYLES)}: "
                          "'discriminative' scores with a sequence classifier "
                          "(reward_model.model.path), 'generative' asks an LLM judge")
    if style == "generative":
        return generative(cfg, worker, peers or {})
    return discriminative(cfg, worker, peers or {})
