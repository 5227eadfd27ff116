"""The ``megatron`` engine plugin (entry point ``siirl.engines: megatron``): actor,
reference and critic on megatron-core's GPTModel, from the ``siirl-engine[megatron]`` extra.

The HF checkpoint (or the built-in model) is loaded with transformers and converted by the
weight bridge into this rank's GPTModel stage (or virtual-pipeline chunks; Transformer
Engine layer spec when TE is importable, the local spec otherwise). The role engines are
the backend-neutral ones of ``siirl.engine.actor`` / ``critic`` over a
:class:`~siirl.engine.megatron.backend.MegatronBackend`; the actor steps megatron's DDP +
distributed optimizer. The HF copy the ``hf`` rollout generates with is refreshed by the
worker's weight-sync step from the backend's bucketed export, from every pipeline stage.
docs/megatron.md has the details.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Callable, Mapping, Optional, Tuple

import megatron.core  # noqa: F401  (fails here, cleanly, without the [megatron] extra)
import torch

from siirl.engine.actor.engine import ActorEngine
from siirl.engine.actor.reference import ReferenceEngine, initial_policy
from siirl.engine.common.config import run_seed, typed_config
from siirl.engine.common.model_loading import load_policy
from siirl.engine.common.optim import build_optimizer
from siirl.engine.common.runtime import resolve_device
from siirl.engine.common.weight_sync import DEFAULT_BUCKET_BYTES, copy_into
from siirl.engine.critic.engine import CriticEngine
from siirl.engine.critic.value_model import ValueModel
from siirl.engine.megatron import lora_setup
from siirl.engine.megatron.backend import MegatronBackend
from siirl.engine.megatron.chunks import model_chunks
from siirl.engine.megatron.heads import MegatronBackbone, logprob_heads, value_heads
from siirl.engine.megatron.mixed_precision import (
    params_dtype,
    rollout_weight_dtype,
    with_main_params,
)
from siirl.engine.megatron.moe import is_moe, num_experts
from siirl.engine.megatron.offload import backend_offloader, role_offload
from siirl.engine.megatron.router_replay import RoutingReplay, replay_settings
from siirl.engine.megatron.setup import build_megatron_model, init_megatron, sequence_parallel
from siirl.engine.megatron.transformer_overrides import (
    optimizer_overrides,
    transformer_overrides,
)
from siirl.engine.models.loader import load_model_and_tokenizer
from siirl.errors import ConfigError
from siirl.execution.dag.planner import reference_needed
from siirl.params import SiiRLArguments

logger = logging.getLogger(__name__)
ACTOR_KEY = "actor_rollout_ref.actor.megatron"


def _parallel_groups() -> Tuple[int, int, Any, Any]:
    """(data-parallel rank, size, group or None, tensor-parallel group or None)."""
    from megatron.core import parallel_state as ps

    dp = ps.get_data_parallel_world_size()
    tp_group = (ps.get_tensor_model_parallel_group()
                if ps.get_tensor_model_parallel_world_size() > 1 else None)
    return (ps.get_data_parallel_rank(), dp, ps.get_data_parallel_group() if dp > 1 else None,
            tp_group)


def expert_groups() -> Tuple[Any, Any]:
    """(expert-data-parallel group, expert tensor-and-model-parallel group: ETP x EP), each
    None where it has one rank; both None where the experts share the dense layers' layout
    (EP 1, expert TP = TP). Otherwise their weights are marked ``allreduce=False`` (megatron
    at EP > 1, ``moe.mark_expert_parameters`` at EP 1)."""
    from megatron.core import parallel_state as ps

    if ps.get_expert_model_parallel_world_size() <= 1 and \
            ps.get_expert_tensor_parallel_world_size() == \
            ps.get_tensor_model_parallel_world_size():
        return None, None
    return (ps.get_expert_data_parallel_group()
            if ps.get_expert_data_parallel_world_size() > 1 else None,
            ps.get_expert_tensor_and_model_parallel_group()
            if ps.get_expert_tensor_and_model_parallel_world_size() > 1 else None)


def grad_averager(module: torch.nn.Module, group: Any, world_size: int,
                  tp_group: Any = None, expert_dp_group: Any = None
                  ) -> Optional[Callable[[], None]]:
    """Gradient sync after the backward, where megatron's DDP does not run: sequence-parallel
    norm weights summed over TP, then everything averaged over data parallelism, as megatron's
    DDP does: dense parameters over the data-parallel ``group``; expert-parallel ones
    (megatron marks them ``allreduce=False``) summed over ``expert_dp_group`` (None: one
    rank) and divided by the whole data-parallel size too, since the token dispatcher
    already brought every expert-parallel rank's tokens into each expert's gradient."""
    from siirl.engine.megatron.sequence_parallel import sum_sequence_parallel_grads

    if world_size <= 1 and tp_group is None and expert_dp_group is None:
        return None

    def average() -> None:
        sum_sequence_parallel_grads(module, tp_group)
        # TP 2 x expert TP 1 at EP 1: one data-parallel rank, two expert data-parallel ones
        if world_size <= 1 and expert_dp_group is None:
            return
        for param in module.parameters():
            if param.grad is None:
                continue
            if getattr(param, "allreduce", True):
                if world_size > 1:
                    torch.distributed.all_reduce(param.grad, group=group)
            elif expert_dp_group is not None:
                torch.distributed.all_reduce(param.grad, group=expert_dp_group)
            param.grad.div_(world_size)
    return average


def _actor_optimizer(cfg: SiiRLArguments, model: torch.nn.Module, group: Any, dp: int,
                     tp_group: Any, dtype: torch.dtype):
    """(optimizer, grad sync): megatron's DDP + distributed optimizer (or its plain one
    with ``use_distributed_optimizer=false``); with virtual pipeline chunks torch AdamW
    and an all-reduce (megatron's DDP wraps one chunk per instance: not wired yet)."""
    from megatron.core import parallel_state

    from siirl.engine.megatron.optimizer_adapter import MegatronOptimizer

    actor_cfg = cfg.actor_rollout_ref.actor
    if (parallel_state.get_virtual_pipeline_model_parallel_world_size() or 1) == 1:
        return MegatronOptimizer(model, actor_cfg.optim, actor_cfg.grad_clip,
                                 bool(actor_cfg.megatron.use_distributed_optimizer),
                                 _optim_overrides(actor_cfg.optim, ACTOR_KEY_OPTIM)), None
    logger.warning("virtual pipeline stages: the actor uses torch AdamW with gradients "
                   "all-reduced over data parallelism, not megatron's distributed optimizer")
    return (with_main_params(build_optimizer(model.parameters(), actor_cfg.optim), dtype,
                             _optim_overrides(actor_cfg.optim, ACTOR_KEY_OPTIM)),
            grad_averager(model, group, dp, tp_group, expert_groups()[0]))


def dist_checkpoint(section: Any, key: str) -> Optional[Tuple[str, Optional[str]]]:
    """(key, path) of the megatron distributed checkpoint the role starts from, or None
    (its weights then come from the Hugging Face model)."""
    return (key, section.dist_checkpointing_path) if section.use_dist_checkpointing else None


def _refresh_hf_copy(hf_model: torch.nn.Module, model: torch.nn.Module, tp_group: Any
                     ) -> None:
    """The HF copy (the rollout's, the reference's initial policy) takes the weights the
    megatron model was loaded with from a distributed checkpoint (collective)."""
    from siirl.engine.megatron.weight_sync import iter_pipeline_hf_weights

    copy_into(hf_model, iter_pipeline_hf_weights(model, hf_model.config, DEFAULT_BUCKET_BYTES,
                                                 tp_group=tp_group))


ACTOR_KEY_OPTIM = "actor_rollout_ref.actor.optim"


def _optim_overrides(optim: Any, key: str) -> dict:
    """A role's ``optim.override_optimizer_config`` (megatron OptimizerConfig fields)."""
    return optimizer_overrides(optim.override_optimizer_config,
                               f"{key}.override_optimizer_config")


def _overrides(megatron: Any, hf_config: Any, key: str) -> dict:
    """A role's ``override_transformer_config``, checked against its model."""
    return transformer_overrides(megatron.override_transformer_config, is_moe(hf_config),
                                 f"{key}.override_transformer_config")


def megatron_actor(config: Any, worker: Any = None) -> ActorEngine:
    """The policy as a megatron GPTModel; ``module`` stays the HF model the rollout uses."""
    cfg = typed_config(config)
    init_megatron(cfg, run_seed(cfg))
    rank, dp, group, tp_group = _parallel_groups()
    hf_model, tokenizer = load_policy(cfg)
    # each role reads its own section's dtype, as in verl
    dtype = params_dtype(cfg.actor_rollout_ref.actor.megatron.dtype,
                         "actor_rollout_ref.actor.megatron.dtype")
    start = dist_checkpoint(cfg.actor_rollout_ref.actor.megatron, ACTOR_KEY)
    overrides = _overrides(cfg.actor_rollout_ref.actor.megatron, hf_model.config, ACTOR_KEY)
    replays = replay_settings(cfg, hf_model.config, overrides)
    model = build_megatron_model(hf_model, resolve_device(cfg), sequence_parallel(cfg), dtype,
                                 start, overrides)
    if start is not None:
        _refresh_hf_copy(hf_model, model, tp_group)
    adapters = lora_setup.attach(cfg, model, hf_model.config)  # None without LoRA
    optimizer, grad_sync = _actor_optimizer(cfg, model, group, dp, tp_group, dtype)
    offload = backend_offloader(role_offload(cfg.actor_rollout_ref.actor.megatron, ACTOR_KEY,
                                             resolve_device(cfg)), model, optimizer,
                                resolve_device(cfg))
    backend = MegatronBackend(model, optimizer, dp_rank=rank, dp_size=dp, dp_group=group,
                              tp_group=tp_group, ep_group=expert_groups()[1],
                              grad_clip=cfg.actor_rollout_ref.actor.grad_clip,
                              grad_sync=grad_sync, hf_module=hf_model,
                              export_dtype=rollout_weight_dtype(cfg, dtype), lora=adapters,
                              merge_on_export=bool(cfg.actor_rollout_ref.model
                                                   .lora_merge_on_export),
                              packing=bool(cfg.actor_rollout_ref.model.use_remove_padding),
                              offload=offload)
    if replays:
        backend.routing = RoutingReplay(
            model, num_experts(hf_model.config), model_chunks(model)[0].config.moe_router_topk,
            tp_group if sequence_parallel(cfg) else None, backend.stages.group)
    # a LoRA actor's reference is its own stage with the adapters off: no initial copy
    initial = copy.deepcopy(hf_model) if dp > 1 and adapters is None else None
    return ActorEngine(backend, cfg, logprob_heads, tokenizer=tokenizer, rollout_module=hf_model,
                       initial_module=initial)


def megatron_reference(config: Any, worker: Any = None,
                       actor: Optional[ActorEngine] = None) -> ReferenceEngine:
    """Frozen initial policy as a megatron GPTModel (the actor's initial HF weights)."""
    cfg = typed_config(config)
    if not reference_needed(cfg):
        return ReferenceEngine(cfg)
    init_megatron(cfg, run_seed(cfg))  # one parallel state per process: the actor's sizes
    rank, dp, _, _ = _parallel_groups()
    if lora_setup.shares_actor_base(actor):  # frozen base weights = the initial policy
        return ReferenceEngine(cfg, MegatronBackend(
            actor.backend.schedule_model, dp_rank=rank, dp_size=dp,
            offload=actor.backend.offload, forward_context=lora_setup.adapters_off(actor)),
            logprob_heads)
    hf_model = initial_policy(actor, lambda: load_policy(cfg)[0])
    # its own checkpoint, else the actor's (the reference is the actor's initial policy)
    start = dist_checkpoint(cfg.actor_rollout_ref.ref.megatron, "actor_rollout_ref.ref.megatron") \
        or dist_checkpoint(cfg.actor_rollout_ref.actor.megatron, ACTOR_KEY)
    model = build_megatron_model(hf_model, resolve_device(cfg), sequence_parallel(cfg),
                                 params_dtype(cfg.actor_rollout_ref.ref.megatron.dtype,
                                              "actor_rollout_ref.ref.megatron.dtype"), start,
                                 _overrides(cfg.actor_rollout_ref.ref.megatron, hf_model.config,
                                            "actor_rollout_ref.ref.megatron"))
    model.requires_grad_(False)
    model.eval()
    packing = bool(cfg.actor_rollout_ref.model.use_remove_padding)
    device = resolve_device(cfg)
    offload = backend_offloader(role_offload(cfg.actor_rollout_ref.ref.megatron,
                                             "actor_rollout_ref.ref.megatron", device,
                                             trains=False), model, None, device)
    return ReferenceEngine(cfg, MegatronBackend(model, dp_rank=rank, dp_size=dp,
                                                packing=packing, offload=offload),
                           logprob_heads)


def megatron_critic(config: Any, worker: Any = None) -> CriticEngine:
    """PPO critic: the fsdp critic's value head (same seeded init) on a megatron GPTModel
    built from ``critic.model``, with the actor's tensor/data-parallel layout."""
    cfg = typed_config(config)
    init_megatron(cfg, run_seed(cfg))
    rank, dp, group, tp_group = _parallel_groups()
    lm, _ = load_model_and_tokenizer(cfg.critic.model, dtype=torch.float32)
    dtype = params_dtype(cfg.critic.megatron.dtype, "critic.megatron.dtype")
    # a distributed checkpoint (an LM's) gives the backbone; the value head starts from
    # its seeded init as with HF weights
    model = build_megatron_model(lm, resolve_device(cfg), sequence_parallel(cfg), dtype,
                                 dist_checkpoint(cfg.critic.megatron, "critic.megatron"),
                                 _overrides(cfg.critic.megatron, lm.config, "critic.megatron"))
    module = ValueModel(MegatronBackbone(model), lm.config.hidden_size, seed=run_seed(cfg))
    optimizer = with_main_params(build_optimizer(module.parameters(), cfg.critic.optim), dtype,
                                 _optim_overrides(cfg.critic.optim, "critic.optim"))
    expert_dp_group, ep_group = expert_groups()
    device = resolve_device(cfg)
    offload = backend_offloader(role_offload(cfg.critic.megatron, "critic.megatron", device),
                                module, optimizer, device)
    backend = MegatronBackend(
        module, optimizer, schedule_model=model,
        dp_rank=rank, dp_size=dp, dp_group=group, tp_group=tp_group, ep_group=ep_group,
        grad_clip=cfg.critic.grad_clip,
        grad_sync=grad_averager(module, group, dp, tp_group, expert_dp_group),
        replicated={"value_head": module.value_head},
        packing=bool(cfg.critic.model.use_remove_padding), offload=offload)
    return CriticEngine(backend, cfg, value_heads(module))


def megatron_engine(role: str, config: Any, worker: Optional[Any] = None,
                    peers: Optional[Mapping[str, Any]] = None) -> Any:
    """Entry point ``siirl.engines: megatron``."""
    if role == "actor":
        return megatron_actor(config, worker)
    if role == "reference":
        return megatron_reference(config, worker, actor=(peers or {}).get("actor"))
    if role == "critic":
        return megatron_critic(config, worker)
    raise ConfigError(f"the megatron engine serves roles actor, critic, reference, "
                      f"not {role!r}")
