"""The ``fsdp`` engine plugin (entry point ``siirl.engines: fsdp``): actor, reference, critic.

``fsdp_engine(role, config, worker)`` builds the engine of a role. With
``torch.distributed`` initialised and more than one rank, modules are sharded with FSDP2
(``fully_shard`` on each decoder layer, then on the root); otherwise they run as plain
modules, which is the single-process CPU/GPU case.
"""

from __future__ import annotations

import copy
import inspect
import json
import os
import time
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from siirl.dag_worker.core_algos import agg_loss
from siirl.dag_worker.data_structures import NodeOutput
from siirl.engine import checkpoint as ckpt
from siirl.engine.actor.dp_actor import DataParallelPPOActor, compute_dtype
from siirl.engine.engine_state import CheckpointedEngine
from siirl.engine.optim import build_lr_scheduler, build_optimizer
from siirl.errors import ConfigError
from siirl.execution.config_select import select

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
ROLLOUT = "actor_rollout_ref.rollout"


def _world(worker: Any) -> Tuple[int, int]:
    """(rank, data-parallel size) from the worker, else from torch.distributed."""
    if worker is not None:
        return int(getattr(worker, "rank", 0)), int(getattr(worker, "world_size", 1))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _group(worker: Any, role: str) -> Any:
    """The worker's process group for ``role`` (None: the default group)."""
    lookup = getattr(worker, "process_group", None)
    return lookup(role) if callable(lookup) else None


def _should_shard(group: Any = None) -> bool:
    return (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size(group) > 1)


def _device(config: Any) -> torch.device:
    from siirl.execution.device import resolve_device

    return resolve_device(config)


def _decoder_layers(module: torch.nn.Module) -> list:
    # HF models name their repeated block classes in _no_split_modules; anything else is
    # sharded per entry of its ModuleLists named like a layer stack.
    names = set(getattr(module, "_no_split_modules", None) or ())
    layers = [m for m in module.modules() if type(m).__name__ in names]
    if layers:
        return layers
    return [layer for name, child in module.named_modules()
            if isinstance(child, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in
            ("layers", "h", "blocks") for layer in child]


def shard_fsdp2(module: torch.nn.Module, fsdp_cfg: Any, group: Any = None) -> torch.nn.Module:
    """``fully_shard`` every decoder layer, then the root (embeddings, norm, head), over the
    ranks of ``group`` (default: the world) on the module's device type."""
    try:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard
    except ImportError as exc:  # torch < 2.6 exposes FSDP2 elsewhere or not at all
        raise ConfigError(f"data-parallel training needs FSDP2 (torch.distributed.fsdp."
                          f"fully_shard), missing in torch {torch.__version__}") from exc
    device_type = next(module.parameters()).device.type
    mesh = DeviceMesh.from_group(group or torch.distributed.group.WORLD, device_type)
    reshard = bool(select(fsdp_cfg, "reshard_after_forward", True))
    for layer in _decoder_layers(module):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(module, mesh=mesh, reshard_after_forward=reshard)
    return module


def reference_needed(config: Any) -> bool:
    return bool(select(config, f"{ACTOR}.use_kl_loss", False)
                or select(config, "algorithm.use_kl_in_reward", False))


def _load_model(config: Any):
    from siirl.engine.models.loader import load_model_and_tokenizer

    return load_model_and_tokenizer(select(config, "actor_rollout_ref.model"),
                                    dtype=torch.float32)


def _seed(config: Any) -> int:
    return int(select(config, "trainer.seed", None) or select(config, "data.seed", 0))


class ActorEngine(CheckpointedEngine):
    """Policy training: ``compute_log_prob``, ``update_policy``, checkpoints, HF export.

    ``module``/``tokenizer``/``logprob_fn`` may be injected (tests, custom models); by
    default the model of ``actor_rollout_ref.model`` is loaded in fp32.
    """

    def __init__(self, config: Any, worker: Any = None, *, module: Optional[torch.nn.Module] = None,
                 tokenizer: Any = None, logprob_fn: Optional[Callable] = None):
        self.config, self.worker = config, worker
        self.rank, self.world_size = _world(worker)
        if module is None:
            module, tokenizer = _load_model(config)
            module.to(_device(config))
        self.module, self.tokenizer = module, tokenizer
        self.group = _group(worker, "actor")
        self.sharded = _should_shard(self.group)
        # Sharded modules cannot be deep-copied later, so when a reference policy will be
        # needed its initial weights are copied now, before sharding and any update.
        self.initial_module = None
        if self.sharded:
            if reference_needed(config):
                self.initial_module = copy.deepcopy(module)
            shard_fsdp2(module, select(config, f"{ACTOR}.fsdp_config"), self.group)
        self.pristine = True  # still the loaded weights (no update, no checkpoint load)
        optim_cfg = select(config, f"{ACTOR}.optim")
        self._optim_cfg = optim_cfg
        total_steps = (select(optim_cfg, "total_training_steps", -1) if optim_cfg else -1)
        if total_steps is None or total_steps <= 0:
            total_steps = select(config, "trainer.total_training_steps", -1)
        optimizer = build_optimizer(module.parameters(), optim_cfg)
        # With only trainer.total_epochs set, the run's length is known once the dataloader
        # exists: the trainer then calls set_total_training_steps before the first update.
        try:
            scheduler = build_lr_scheduler(optimizer, optim_cfg, total_steps or -1)
        except ConfigError:
            scheduler = None  # needs the run's length; see set_total_training_steps
        self.actor = DataParallelPPOActor(
            module, select(config, ACTOR), select(config, f"{ROLLOUT}.temperature", 1.0),
            optimizer=optimizer, lr_scheduler=scheduler,
            rollout_n=select(config, f"{ROLLOUT}.n", 1), world_size=self.world_size,
            seed=_seed(config),
            log_prob_micro_batch_size=select(config,
                                             f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu"),
            logprob_fn=logprob_fn,
            autocast_dtype=compute_dtype(select(config, f"{ACTOR}.fsdp_config")),
            group=self.group)

    config_prefix = ACTOR

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.actor.optimizer

    @property
    def trainer(self) -> DataParallelPPOActor:
        return self.actor

    def _scheduler(self) -> Any:
        """The lr schedule; building it here raises the clear error when it needs a run
        length nobody provided (a cosine or ratio-warmup schedule without steps)."""
        if self.actor.lr_scheduler is None:
            self.actor.lr_scheduler = build_lr_scheduler(self.actor.optimizer, self._optim_cfg,
                                                         -1)
        return self.actor.lr_scheduler

    def set_total_training_steps(self, steps: int) -> None:
        """(Re)build the lr schedule for a run of ``steps`` updates; only before the first
        update, so a schedule already in use is never replaced."""
        if self.pristine and (self.actor.lr_scheduler is None or
                              self.actor.lr_scheduler.last_epoch == 0):
            self.actor.lr_scheduler = build_lr_scheduler(self.actor.optimizer, self._optim_cfg,
                                                         steps)

    @property
    def lr_scheduler(self) -> Any:
        return self.actor.lr_scheduler

    def compute_log_prob(self, batch: Any) -> NodeOutput:
        """Adds ``old_log_probs``; logs the rollout policy's entropy as ``actor/entropy``."""
        log_probs, entropy = self.actor.compute_log_prob(batch, calculate_entropy=True)
        batch.set("old_log_probs", log_probs)
        metrics = {}
        if "response_mask" in batch.keys():
            mode = select(self.config, f"{ACTOR}.loss_agg_mode", "token-mean")
            metrics["actor/entropy"] = float(agg_loss(entropy, batch["response_mask"], mode))
        return NodeOutput(batch=batch, metrics=metrics)

    def update_policy(self, batch: Any) -> NodeOutput:
        start = time.perf_counter()
        self._scheduler()
        metrics = self.actor.update_policy(batch)
        self.pristine = False
        seconds = time.perf_counter() - start
        tokens = float(batch["attention_mask"].sum()) * self.actor.world_size
        metrics["perf/actor_update_s"] = seconds
        metrics["perf/actor_tokens_per_s"] = tokens / max(seconds, 1e-9)
        return NodeOutput(batch=batch, metrics=metrics)

    # ---- persistence ---------------------------------------------------------------

    def export_hf(self, directory: str) -> None:
        """A plain transformers directory (config, safetensors weights, tokenizer)."""
        state = ckpt.model_state_dict(self.module, self.sharded)
        if self.rank == 0:
            with ckpt.atomic_dir(directory) as tmp:
                kwargs: Dict[str, Any] = {"state_dict": state}
                if "safe_serialization" in inspect.signature(
                        self.module.save_pretrained).parameters:  # transformers 4.x
                    kwargs["safe_serialization"] = True
                self.module.save_pretrained(tmp, **kwargs)
                if self.sharded:
                    _fix_architectures(tmp, self.module)
                if self.tokenizer is not None:
                    self.tokenizer.save_pretrained(tmp)
        if self.sharded:
            torch.distributed.barrier(group=self.group)


def _fix_architectures(directory: str, module: torch.nn.Module) -> None:
    # FSDP2 swaps the module's class for a generated "FSDP<Name>" subclass; older
    # transformers would write that name into config.json, which nothing can load.
    path = os.path.join(directory, "config.json")
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, FSDPModule) or not os.path.exists(path):
        return  # not sharded, or a model without a config.json (nothing to fix)
    base = next(c for c in type(module).__mro__[1:] if not issubclass(c, FSDPModule))
    with open(path) as handle:
        config = json.load(handle)
    config["architectures"] = [base.__name__]
    with open(path, "w") as handle:
        json.dump(config, handle, indent=2)


class ReferenceEngine:
    """Frozen initial policy: ``compute_ref_log_prob`` adds ``ref_log_prob``.

    When neither ``actor.use_kl_loss`` nor ``algorithm.use_kl_in_reward`` is set, nothing
    reads ``ref_log_prob``, so the forward is skipped (a whole model forward saved per step,
    which matters on CPU) and the batch passes through with metric ``ref/skipped=1``.
    """

    def __init__(self, config: Any, worker: Any = None, *, module: Optional[torch.nn.Module] = None,
                 logprob_fn: Optional[Callable] = None):
        self.config, self.worker = config, worker
        self.rank, self.world_size = _world(worker)
        self.enabled = reference_needed(config)
        self.module = self.actor = None
        if not self.enabled:
            return
        module = module if module is not None else self._initial_module(config, worker)
        module.requires_grad_(False)
        module.eval()
        group = _group(worker, "reference")
        if _should_shard(group):
            shard_fsdp2(module, select(config, f"{REF}.fsdp_config"), group)
        self.module = module
        micro = (select(config, f"{REF}.log_prob_micro_batch_size_per_gpu")
                 or select(config, f"{ACTOR}.ppo_micro_batch_size_per_gpu"))
        self.actor = DataParallelPPOActor(
            module, select(config, REF), select(config, f"{ROLLOUT}.temperature", 1.0),
            world_size=self.world_size, log_prob_micro_batch_size=micro,
            logprob_fn=logprob_fn,
            autocast_dtype=compute_dtype(select(config, f"{REF}.fsdp_config")),
            group=group)

    @staticmethod
    def _initial_module(config: Any, worker: Any) -> torch.nn.Module:
        engines = getattr(worker, "engines", None)
        actor = engines.get("actor") if engines is not None and "actor" in engines else None
        if actor is not None and getattr(actor, "initial_module", None) is not None:
            module, actor.initial_module = actor.initial_module, None  # hand over, no 2nd copy
            return module
        if actor is not None and actor.pristine and not actor.sharded:
            return copy.deepcopy(actor.module)
        # No actor here, or it has moved on from its initial weights: load them again.
        return _load_model(config)[0].to(_device(config))

    def compute_ref_log_prob(self, batch: Any) -> NodeOutput:
        if not self.enabled:
            return NodeOutput(batch=batch, metrics={"ref/skipped": 1.0})
        log_probs, _ = self.actor.compute_log_prob(batch)
        batch.set("ref_log_prob", log_probs)
        return NodeOutput(batch=batch, metrics={})


def critic_engine(config: Any, worker: Any = None) -> Any:
    """Role ``critic``: ``siirl.engine.critic.engine.CriticEngine``, imported on first use
    because it builds on this module's helpers (a top-level import would be circular)."""
    from siirl.engine.critic.engine import CriticEngine

    return CriticEngine(config, worker)


_ROLES: Dict[str, Callable[[Any, Any], Any]] = {
    "actor": ActorEngine,
    "reference": ReferenceEngine,
    "critic": critic_engine,
}


def fsdp_engine(role: str, config: Any, worker: Any = None) -> Any:
    """Entry point ``siirl.engines: fsdp`` (``siirl.engine.fsdp_workers:fsdp_engine``)."""
    if role not in _ROLES:
        raise ConfigError(f"the fsdp engine serves roles {', '.join(sorted(_ROLES))}, "
                          f"not {role!r}")
    return _ROLES[role](config, worker)
