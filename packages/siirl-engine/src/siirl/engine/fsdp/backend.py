"""``FSDPBackend``: the training verbs over one torch module, plain, FSDP2-sharded or
replicated on every data-parallel rank (``fsdp_size=1``).

Every rank runs the same number of forwards on its own rows; gradients are averaged over
the data-parallel ranks (by FSDP2 when sharded, by one flat all-reduce when replicated).
Batches live on the CPU between nodes; each micro-batch moves to the module's device for
its forward, and forward-only results come back to the CPU.

A LoRA module (peft-wrapped, ``siirl.engine.models.lora``) checkpoints and exports its
adapters only (``adapter_checkpoint``) and sends the rollout its merged weights.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, Optional, Tuple

import torch

from siirl.engine.common import checkpoint as ckpt
from siirl.engine.common.backend import Head, MicroLoss, concat_outputs
from siirl.engine.common.dp_utils import clip_grad_norm, step_if_finite
from siirl.engine.common.dynamic_batch import micro_batches
from siirl.engine.common.replicas import average_gradients, broadcast_parameters
from siirl.engine.common.runtime import module_device
from siirl.engine.common.weight_sync import Bucket, buckets_of
from siirl.engine.fsdp import adapter_checkpoint
from siirl.engine.fsdp import offload as cpu_offload
from siirl.engine.fsdp.sharding import fix_architectures
from siirl.engine.models import lora
from siirl.errors import ConfigError

# fsdp_config.model_dtype -> autocast dtype; None keeps everything in the weights' dtype
_COMPUTE_DTYPES = {
    "fp32": None, "float32": None,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
}


def compute_dtype(model_dtype: Optional[str]) -> Optional[torch.dtype]:
    """The autocast dtype ``fsdp_config.model_dtype`` asks for (None: fp32, the default).

    Weights (and so optimizer state) stay in the dtype they were loaded in; a low-precision
    ``model_dtype`` only runs the forward under autocast, and outputs come back as fp32.
    """
    if model_dtype is None:
        return None
    key = str(model_dtype).replace("torch.", "")
    if key not in _COMPUTE_DTYPES:
        raise ConfigError(f"fsdp_config.model_dtype={model_dtype!r} is not supported; "
                          f"supported: {', '.join(sorted(_COMPUTE_DTYPES))}")
    return _COMPUTE_DTYPES[key]


class FSDPBackend:
    """``module`` (already sharded when ``sharded``), its optimizer (None: forward only).

    ``dp_*`` are the ranks holding other rows; ``shard`` (rank, group) those the module is
    sharded or replicated over, when they differ (Ulysses sequence parallelism:
    ``siirl.engine.fsdp.placement``).
    ``replicated``: the module is whole on every rank of the shard group; its weights are
    taken from the group's first rank now and gradients averaged before each step.
    ``merge_on_export``: a LoRA module's HF export holds the merged model as well.
    ``offload``: sharded with FSDP2's CPU offload (``siirl.engine.fsdp.offload``)."""

    token_plans = True  # micro-batches may be cut by tokens (dynamic batch size)

    def __init__(self, module: torch.nn.Module, optimizer: Any = None, *, dp_rank: int = 0,
                 dp_size: int = 1, dp_group: Any = None, sharded: bool = False,
                 replicated: bool = False,
                 grad_clip: Any = 1.0, autocast_dtype: Optional[torch.dtype] = None,
                 merge_on_export: bool = False, shard: Optional[Tuple[int, Any]] = None,
                 offload: bool = False):
        if sharded and replicated:
            raise ValueError("a module is either sharded or replicated, not both")
        self.module, self.optimizer = module, optimizer
        self.dp_rank, self.dp_size, self.dp_group = dp_rank, dp_size, dp_group
        self.shard_rank, self.shard_group = shard if shard is not None else (dp_rank, dp_group)
        self.sharded, self.replicated = sharded, replicated
        self.offload = offload
        if replicated:
            broadcast_parameters(module, self.shard_group)
        self.grad_clip = grad_clip
        self.autocast_dtype = autocast_dtype
        self.lora = lora.is_lora(module)
        self.merge_on_export = merge_on_export

    @property
    def device(self) -> torch.device:
        return module_device(self.module)

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    # ---- training verbs ------------------------------------------------------------

    def forward_backward_batch(self, data: Any, micro_rows: int, head: Head,
                               loss_fn: Optional[MicroLoss] = None,
                               forward_only: bool = False) -> Optional[Dict[str, torch.Tensor]]:
        device = self.device
        parts = []
        micros, restore = micro_batches(data, micro_rows)  # rows, or a token plan
        for micro in micros:
            micro = micro.to(device)
            with self._autocast():
                outputs = head.fn(self.module, micro)
            outputs = {name: value.float() for name, value in outputs.items()
                       if value is not None}
            if forward_only:
                parts.append(outputs)
            else:
                loss_fn(micro, outputs).backward()
        if not forward_only:
            return None
        outputs = concat_outputs(parts, head.outputs)
        if restore is not None:  # a token plan's micro-batches back into row order
            outputs = {name: value[restore] for name, value in outputs.items()}
        return outputs

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def optimizer_step(self) -> float:
        if self.replicated:
            average_gradients(self.module, self.shard_group)
        if self.offload:
            norm = cpu_offload.clip_grad_norm(self.module, self.grad_clip, self.shard_group,
                                          self.device)
        else:
            norm = clip_grad_norm(self.module, self.grad_clip)
        return step_if_finite(self.optimizer, norm)

    def share_metrics(self, metrics: Dict[str, float]) -> Dict[str, float]:
        return metrics  # every data-parallel rank computed the global values already

    # ---- persistence ---------------------------------------------------------------

    def save_checkpoint(self, directory: str, extra: Dict[str, Any],
                        contents: Tuple[str, ...]) -> None:
        if self.lora:
            adapter_checkpoint.save_checkpoint(directory, self, extra, contents)
            return
        if self.replicated:  # the replicas are equal: the first rank writes for all
            if self.shard_rank == 0:
                ckpt.save_checkpoint(directory, self.module, self.optimizer, extra,
                                     contents=contents)
            torch.distributed.barrier(group=self.shard_group)
            return
        ckpt.save_checkpoint(directory, self.module, self.optimizer, extra,
                             sharded=self.sharded, rank=self.shard_rank,
                             group=self.shard_group, contents=contents)

    def load_checkpoint(self, directory: str, contents: Tuple[str, ...]) -> Dict[str, Any]:
        if self.lora:
            return adapter_checkpoint.load_checkpoint(directory, self, contents)
        return ckpt.load_checkpoint(directory, self.module, self.optimizer,
                                    sharded=self.sharded, group=self.shard_group,
                                    contents=contents)

    def export_hf(self, directory: str, tokenizer: Any) -> None:
        """A plain transformers directory (config, safetensors weights, tokenizer); for
        LoRA a peft adapter directory."""
        if self.lora:
            adapter_checkpoint.export_hf(directory, self, tokenizer, self.merge_on_export)
            return
        state = ckpt.model_state_dict(self.module, self.sharded)
        if self.shard_rank == 0:
            finish = ((lambda tmp: fix_architectures(tmp, self.module)) if self.sharded
                      else None)
            ckpt.save_pretrained_dir(directory, self.module, state, tokenizer, finish)
        if self.sharded or self.replicated:
            torch.distributed.barrier(group=self.shard_group)

    def export_weights(self, bucket_bytes: int) -> Iterator[Bucket]:
        """The full (unsharded) HF-named tensors in buckets of about ``bucket_bytes``
        (collective when sharded: every rank gathers each tensor); LoRA: the base model's
        names with the adapters merged in."""
        if self.lora:
            yield from buckets_of(lora.merged_weights(self.module), bucket_bytes)
            return
        device = self.device  # offloaded shards gather on the device (NCCL has no CPU)
        named = ((name, tensor.to(device).full_tensor() if hasattr(tensor, "full_tensor")
                  else tensor) for name, tensor in self.module.state_dict().items())
        yield from buckets_of(named, bucket_bytes)
