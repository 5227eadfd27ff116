"""The ``fsdp`` engine plugin (entry point ``siirl.engines: fsdp``): actor, reference and
critic on torch modules.

``fsdp_engine(role, config, worker, peers)`` builds the engine of a role. With
``torch.distributed`` initialised and more than one rank in the role's group, modules are
sharded with FSDP2 (``fully_shard`` on each decoder layer, then on the root), or, with
``fsdp_config.fsdp_size=1``, replicated whole on every rank (gradients averaged once per
update); otherwise they run as plain modules, which is the single-process CPU/GPU case.
``ulysses_sequence_parallel_size`` > 1 splits each packed sequence over groups of ranks
(``siirl.engine.fsdp.ulysses``, ``placement``).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch

from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    INPUT_IDS,
    POSITION_IDS,
    model_extra_inputs,
)
from siirl.engine.actor.embodied_actor import episode_logprobs, is_episode_batch
from siirl.engine.actor.engine import ActorEngine
from siirl.engine.actor.reference import (
    ReferenceEngine,
    initial_policy,
    shares_actor_base,
)
from siirl.engine.common.backend import Head
from siirl.engine.common.config import run_seed, typed_config
from siirl.engine.common.model_loading import load_policy
from siirl.engine.common.optim import build_optimizer
from siirl.engine.common.runtime import resolve_device, should_shard
from siirl.engine.critic.engine import CriticEngine
from siirl.engine.critic.value_model import build_value_model, packed_values, response_values
from siirl.engine.fsdp.backend import FSDPBackend, compute_dtype
from siirl.engine.fsdp.offload import asked as offload_asked
from siirl.engine.fsdp.offload import wants_offload
from siirl.engine.fsdp.placement import Placement, placement
from siirl.engine.fsdp.sharding import replicates, shard_fsdp2
from siirl.engine.fsdp.ulysses import SequenceParallel, check_model
from siirl.engine.fsdp.ulysses_forward import (
    ulysses_logprobs,
    ulysses_values,
    widen_token_budgets,
)
from siirl.engine.models import lora
from siirl.engine.models.logprob import packed_logprobs, response_logprobs
from siirl.engine.models.packing import on_packed
from siirl.engine.models.padding import on_used_columns
from siirl.errors import ConfigError
from siirl.execution.dag.planner import reference_needed

_ACTOR, _REF, _MODEL = ("actor_rollout_ref.actor", "actor_rollout_ref.ref",
                        "actor_rollout_ref.model")


def logprob_heads(logprob_fn: Optional[Callable] = None, remove_padding: bool = False,
                  sp: Optional[SequenceParallel] = None) -> Callable[[int, float, bool], Head]:
    """Log-prob heads over a transformers module (``logprob_fn`` defaults to
    ``siirl.engine.models.logprob.response_logprobs``). With ``remove_padding``
    (``actor_rollout_ref.model.use_remove_padding``) text rows run packed
    (``siirl.engine.models.packing``), split over ``sp``'s group when given; an injected
    ``logprob_fn`` always reads padded rows. Rows that do not pack run whole on every rank
    of the group (the same values and, see ``ulysses``, the same gradients)."""
    fn = logprob_fn or response_logprobs
    packs = remove_padding and logprob_fn is None

    def heads(response_length: int, temperature: float, calculate_entropy: bool) -> Head:
        def named(module, input_ids, attention_mask, position_ids, width, **extras):
            log_probs, entropy = fn(module, input_ids, attention_mask, position_ids,
                                    response_length=width, temperature=temperature,
                                    calculate_entropy=calculate_entropy, **extras)
            return {"log_probs": log_probs, "entropy": entropy}

        def packed(module, rows):
            if sp is not None:
                log_probs, entropy = ulysses_logprobs(module, rows, sp, temperature,
                                                      calculate_entropy)
            else:
                log_probs, entropy = packed_logprobs(module, rows, temperature,
                                                     calculate_entropy)
            return {"log_probs": log_probs, "entropy": entropy}

        def head(module: torch.nn.Module, micro: Any) -> Dict[str, Any]:
            if is_episode_batch(micro):  # a VLA's episodes: one forward per chunk
                return episode_logprobs(module, micro, temperature, calculate_entropy)
            extras = {k: micro[k] for k in model_extra_inputs if k in micro.keys()}
            rows = (module, micro[INPUT_IDS], micro[ATTENTION_MASK], micro[POSITION_IDS],
                    response_length)
            if packs and not extras:  # images ride along per row: those rows stay padded
                outputs = on_packed(packed, *rows)
                if outputs is not None:
                    return outputs
            return on_used_columns(named, *rows, **extras)

        names = ("log_probs", "entropy") if calculate_entropy else ("log_probs",)
        return Head(head, names)

    return heads


def value_heads(value_fn: Optional[Callable] = None, remove_padding: bool = False,
                sp: Optional[SequenceParallel] = None) -> Callable[[int], Head]:
    """Value heads over a value model (``value_fn`` defaults to ``response_values``); with
    ``remove_padding`` (``critic.model.use_remove_padding``) rows run packed, split over
    ``sp``'s group when given, except with an injected ``value_fn``."""
    fn = value_fn or response_values
    packs = remove_padding and value_fn is None

    def heads(response_length: int) -> Head:
        def named(module, input_ids, attention_mask, position_ids, width):
            return {"values": fn(module, input_ids, attention_mask, position_ids, width)}

        def packed(module, rows):
            if sp is not None:
                return {"values": ulysses_values(module, rows, sp)}
            return {"values": packed_values(module, rows)}

        def head(module: torch.nn.Module, micro: Any) -> Dict[str, Any]:
            rows = (module, micro[INPUT_IDS], micro[ATTENTION_MASK], micro[POSITION_IDS],
                    response_length)
            outputs = on_packed(packed, *rows) if packs else None
            return outputs if outputs is not None else on_used_columns(named, *rows)

        return Head(head, ("values",))

    return heads


def data_parallel_layout(group: Any, fsdp_config: Any, key: str) -> Tuple[bool, bool]:
    """(sharded, replicated) for a role over ``group`` with ``fsdp_config`` (``key`` names
    it in errors); both False for a single rank."""
    if not should_shard(group):
        return False, False
    replicated = replicates(fsdp_config.fsdp_size, torch.distributed.get_world_size(group),
                            f"{key}.fsdp_size")
    return not replicated, replicated


def _layout(cfg: Any, place: Placement, fsdp_config: Any, key: str) -> Tuple[bool, bool, bool]:
    """(sharded, replicated, offload) of a role's module: CPU offload shards even a single
    rank's module (FSDP2 is what offloads)."""
    sharded, replicated = data_parallel_layout(place.shard_group, fsdp_config, key)
    device = resolve_device(cfg) if offload_asked(fsdp_config) else None
    offload = wants_offload(fsdp_config, key, device, replicated)
    return sharded or offload, replicated, offload


def _sequence_parallel(worker: Any, role: str, size: Any, key: str, remove_padding: bool,
                       remove_padding_key: str, module: torch.nn.Module) -> Placement:
    place = placement(worker, role, size, key, remove_padding, remove_padding_key)
    if place.sequence_parallel is not None:
        check_model(module, place.sequence_parallel.size, key)
    return place


def fsdp_actor(config: Any, worker: Any = None, *, module: Optional[torch.nn.Module] = None,
               tokenizer: Any = None, logprob_fn: Optional[Callable] = None) -> ActorEngine:
    """The policy; ``module``/``tokenizer``/``logprob_fn`` may be injected (tests, custom
    models), by default the model of ``actor_rollout_ref.model`` is loaded in fp32. With
    ``lora_rank > 0`` the module gets LoRA adapters and only they train."""
    cfg = typed_config(config)
    actor_cfg, model_cfg = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.model
    if module is None:
        module, tokenizer = load_policy(cfg)
    place = _sequence_parallel(worker, "actor", actor_cfg.ulysses_sequence_parallel_size,
                               f"{_ACTOR}.ulysses_sequence_parallel_size",
                               model_cfg.use_remove_padding, f"{_MODEL}.use_remove_padding",
                               module)
    adapters = lora.lora_enabled(model_cfg)
    if adapters:
        module = lora.wrap(module, model_cfg, seed=run_seed(cfg))
    sharded, replicated, offload = _layout(cfg, place, actor_cfg.fsdp_config,
                                           f"{_ACTOR}.fsdp_config")
    initial = None
    if sharded:
        # Sharded modules cannot be deep-copied later, so when a reference policy will be
        # needed its initial weights are copied now, before sharding and any update. LoRA
        # needs no copy: the frozen base weights are the reference's.
        if reference_needed(cfg) and not adapters:
            initial = copy.deepcopy(module)
        shard_fsdp2(module, actor_cfg.fsdp_config.reshard_after_forward, place.shard_group,
                    offload=offload)
    backend = FSDPBackend(module, build_optimizer(module.parameters(), actor_cfg.optim),
                          **place.backend_kwargs(), sharded=sharded, replicated=replicated,
                          grad_clip=actor_cfg.grad_clip, offload=offload,
                          autocast_dtype=compute_dtype(actor_cfg.fsdp_config.model_dtype),
                          merge_on_export=bool(model_cfg.lora_merge_on_export))
    heads = logprob_heads(logprob_fn, model_cfg.use_remove_padding, place.sequence_parallel)
    engine = ActorEngine(backend, cfg, heads, tokenizer=tokenizer, initial_module=initial)
    engine.sequence_parallel = place.sequence_parallel  # the reference shares its groups
    widen_token_budgets(engine.actor, place.sequence_parallel)
    return engine


def fsdp_reference(config: Any, worker: Any = None, *, actor: Optional[ActorEngine] = None,
                   module: Optional[torch.nn.Module] = None,
                   logprob_fn: Optional[Callable] = None) -> ReferenceEngine:
    """The frozen initial policy: ``module``, else the initial weights of ``actor``; for a
    LoRA actor its own module with the adapters switched off (no copy)."""
    cfg = typed_config(config)
    if not reference_needed(cfg):
        return ReferenceEngine(cfg)
    ref_cfg, model_cfg = cfg.actor_rollout_ref.ref, cfg.actor_rollout_ref.model
    autocast = compute_dtype(ref_cfg.fsdp_config.model_dtype)
    if module is None and shares_actor_base(actor):
        # already laid out (sharded or not) for the actor's ranks; the actor sets its
        # train/eval mode and gradients, so nothing of it is frozen here
        trained = actor.backend
        heads = logprob_heads(logprob_fn, model_cfg.use_remove_padding,
                              getattr(actor, "sequence_parallel", None))
        backend = FSDPBackend(trained.module, dp_rank=trained.dp_rank, dp_size=trained.dp_size,
                              dp_group=trained.dp_group, sharded=trained.sharded,
                              shard=(trained.shard_rank, trained.shard_group),
                              offload=trained.offload, autocast_dtype=autocast)
        engine = ReferenceEngine(cfg, backend, lora.without_adapters(heads))
        widen_token_budgets(engine.actor, getattr(actor, "sequence_parallel", None))
        return engine
    if module is None:
        module = initial_policy(actor, lambda: load_policy(cfg)[0])
    module.requires_grad_(False)
    module.eval()
    place = _sequence_parallel(worker, "reference", ref_cfg.ulysses_sequence_parallel_size,
                               f"{_REF}.ulysses_sequence_parallel_size",
                               model_cfg.use_remove_padding, f"{_MODEL}.use_remove_padding",
                               module)
    # frozen: a replicated reference needs no communication at all
    sharded, _, offload = _layout(cfg, place, ref_cfg.fsdp_config, f"{_REF}.fsdp_config")
    if sharded:
        shard_fsdp2(module, ref_cfg.fsdp_config.reshard_after_forward, place.shard_group,
                    offload=offload)
    backend = FSDPBackend(module, **place.backend_kwargs(), sharded=sharded, offload=offload,
                          autocast_dtype=autocast)
    engine = ReferenceEngine(cfg, backend, logprob_heads(
        logprob_fn, model_cfg.use_remove_padding, place.sequence_parallel))
    widen_token_budgets(engine.actor, place.sequence_parallel)
    return engine


def fsdp_critic(config: Any, worker: Any = None, *, module: Optional[torch.nn.Module] = None,
                value_fn: Optional[Callable] = None) -> CriticEngine:
    """The value model of ``critic.model`` (default: the actor's model with a value head)
    in fp32, with its own AdamW (``critic.optim``); ``module``/``value_fn`` injectable."""
    cfg = typed_config(config)
    critic_cfg = cfg.critic
    if module is None:
        device = resolve_device(cfg)
        module = build_value_model(critic_cfg.model, seed=run_seed(cfg),
                                   device_type=device.type)
        module.to(device)
    place = _sequence_parallel(worker, "critic", critic_cfg.ulysses_sequence_parallel_size,
                               "critic.ulysses_sequence_parallel_size",
                               critic_cfg.model.use_remove_padding,
                               "critic.model.use_remove_padding", module)
    sharded, replicated, offload = _layout(cfg, place, critic_cfg.model.fsdp_config,
                                           "critic.model.fsdp_config")
    if sharded:
        shard_fsdp2(module, critic_cfg.model.fsdp_config.reshard_after_forward,
                    place.shard_group, offload=offload)
    backend = FSDPBackend(module, build_optimizer(module.parameters(), critic_cfg.optim),
                          **place.backend_kwargs(), sharded=sharded, replicated=replicated,
                          grad_clip=critic_cfg.grad_clip, offload=offload,
                          autocast_dtype=compute_dtype(critic_cfg.model.fsdp_config.model_dtype))
    engine = CriticEngine(backend, cfg, value_heads(value_fn, critic_cfg.model.use_remove_padding,
                                                    place.sequence_parallel))
    widen_token_budgets(engine.critic, place.sequence_parallel)
    return engine


def fsdp_engine(role: str, config: Any, worker: Any = None,
                peers: Optional[Mapping[str, Any]] = None) -> Any:
    """Entry point ``siirl.engines: fsdp``; ``peers`` are the worker's engines built
    before this one (the reference starts from the actor's initial weights)."""
    peers = peers or {}
    if role == "actor":
        return fsdp_actor(config, worker)
    if role == "reference":
        return fsdp_reference(config, worker, actor=peers.get("actor"))
    if role == "critic":
        return fsdp_critic(config, worker)
    if role == "reward_model":  # reward_model.enable=true
        from siirl.engine.reward_model.factory import fsdp_reward_model

        return fsdp_reward_model(config, worker, peers)
    raise ConfigError(f"the fsdp engine serves roles actor, critic, reference, reward_model, "
                      f"not {role!r}")
