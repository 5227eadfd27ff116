"""Megatron's DDP and distributed optimizer behind the few optimizer calls the PPO actor
makes (``param_groups``, ``zero_grad``, a step that skips non-finite gradients).

Gradients land in DDP's contiguous fp32 buffers (``param.main_grad``); at the end of each
mini-batch megatron's pipeline schedule calls ``finalize_model_grads`` through
``config.finalize_model_grads_func`` (data-parallel reduce-scatter and average, sequence-
parallel norm grads over TP, tied embeddings between the first and last stage). The step
then reads the global grad norm (over TP x PP), skips it when non-finite (megatron would
write NaNs into fp32 weights), else clips and steps; each data-parallel rank updates its
shard and the shards are all-gathered. Optimizer state is saved with dist_checkpointing.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Optional

import torch

from siirl.engine.common.optim import optim_settings
from siirl.engine.megatron.mixed_precision import loss_scaler
from siirl.engine.megatron.optimizer import (
    build_distributed_optimizer,
    finish_grad_sync,
    load_optimizer_checkpoint,
    save_optimizer_checkpoint,
    zero_grad,
)

OPTIM_DIR, LAYOUT_FILE = "dist_optim", "layout.json"


def _layout() -> dict[str, int]:
    from megatron.core import parallel_state as ps

    return {"tp": ps.get_tensor_model_parallel_world_size(),
            "pp": ps.get_pipeline_model_parallel_world_size(),
            "dp": ps.get_data_parallel_world_size()}


class MegatronOptimizer:
    """megatron's DDP wrapper + (distributed) Adam(W) for one GPTModel stage."""

    def __init__(self, model: torch.nn.Module, optim_cfg: Any, grad_clip: Any,
                 use_distributed_optimizer: bool = True,
                 optimizer_overrides: Optional[dict] = None):
        clip = float(grad_clip) if grad_clip and float(grad_clip) > 0 else 0.0
        optim = optim_settings(optim_cfg)
        self.ddp_model, self.megatron = build_distributed_optimizer(
            model, lr=float(optim.lr), betas=tuple(float(b) for b in optim.betas),
            weight_decay=float(optim.weight_decay), clip_grad=clip,
            use_distributed_optimizer=use_distributed_optimizer,
            optimizer_overrides=optimizer_overrides)
        # with expert parallelism megatron chains a dense and an expert optimizer (each over
        # its own data-parallel group); the lr schedule drives the first one's groups and
        # step_if_finite hands that lr on to the others
        subs = getattr(self.megatron, "chained_optimizers", [self.megatron])
        self.torch_optimizer = subs[0].optimizer
        self._followers = [sub.optimizer for sub in subs[1:]]
        # the schedule calls this after the last backward of a mini-batch
        model.config.finalize_model_grads_func = self._finalize
        # fp16: megatron's step unscales (the backend hands its scale_loss to the schedule)
        self.scales_loss = loss_scaler(self.megatron) is not None

    def _finalize(self, *_args: Any, **_kwargs: Any) -> None:
        finish_grad_sync(self.ddp_model)

    @property
    def param_groups(self) -> list:
        return self.torch_optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        zero_grad(self.ddp_model, self.megatron)

    def _share_lr(self) -> None:
        """The scheduled lr (one for every group) on the chained optimizers' groups too."""
        if not self._followers:
            return
        lrs = {group["lr"] for group in self.torch_optimizer.param_groups}
        if len(lrs) != 1:
            raise NotImplementedError(f"one lr for every parameter group, got {sorted(lrs)}")
        lr = lrs.pop()
        for optimizer in self._followers:
            for group in optimizer.param_groups:
                group["lr"] = lr

    def step_if_finite(self) -> float:
        """Clip and step unless the global grad norm is non-finite; the norm (pre-clip).
        fp16: megatron's step unscales, finds any inf/NaN (then skips and backs the loss
        scale off: the norm returned is inf), clips and steps."""
        self._share_lr()
        if self.scales_loss:
            stepped, norm, _zeros = self.megatron.step()
            if not stepped:
                self.zero_grad()
                return math.inf
            return float(norm)
        self.megatron.prepare_grads()
        norm = float(self.megatron.get_grad_norm())
        if not math.isfinite(norm):
            self.zero_grad()
            return norm
        self.megatron.step()  # prepares again (a copy), clips by the same norm, steps
        return norm

    def save(self, directory: str, write_layout: bool) -> None:
        path = os.path.join(directory, OPTIM_DIR)
        os.makedirs(path, exist_ok=True)
        torch.distributed.barrier()
        save_optimizer_checkpoint(self.megatron, self.ddp_model, path)
        if write_layout:
            with open(os.path.join(path, LAYOUT_FILE), "w") as handle:
                json.dump(_layout(), handle)

    def load(self, directory: str) -> bool:
        """False (nothing loaded) when the state was written at other TP/PP/DP sizes: the
        distributed optimizer's shards follow the data-parallel split of the buffers."""
        path = os.path.join(directory, OPTIM_DIR)
        layout_path = os.path.join(path, LAYOUT_FILE)
        if not os.path.exists(layout_path):
            return False
        with open(layout_path) as handle:
            if json.load(handle) != _layout():
                return False
        load_optimizer_checkpoint(self.megatron, self.ddp_model, path)
        return True
