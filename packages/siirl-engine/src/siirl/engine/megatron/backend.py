"""``MegatronBackend``: the training verbs over a megatron GPT stage (or a value model whose
backbone is one), every micro-batch run by megatron's own pipeline schedule
(:func:`~siirl.engine.megatron.pipeline.run_pipeline`: 1F1B over the pipeline stages at
PP > 1). Heads and losses run on the last stage; results and metrics computed there are
broadcast to the other stages, since every stage of a pipeline hands the same rows on.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import torch

from siirl.data_coordinator.fields import RESPONSES, ROUTED_EXPERTS
from siirl.engine.common import checkpoint as ckpt
from siirl.engine.common.backend import Head, MicroLoss
from siirl.engine.common.dp_utils import clip_grad_norm, step_if_finite
from siirl.engine.common.dynamic_batch import Micro, micro_batches
from siirl.engine.common.weight_sync import DEFAULT_BUCKET_BYTES, Bucket, copy_into
from siirl.engine.megatron import checkpointing, lora_checkpoint
from siirl.engine.megatron.chunks import model_chunks
from siirl.engine.megatron.lora_state import iter_merged_hf_weights
from siirl.engine.megatron.mixed_precision import loss_scaler
from siirl.engine.megatron.offload import Offloader
from siirl.engine.megatron.optimizer_adapter import MegatronOptimizer
from siirl.engine.megatron.packing import ROW_MASK, pack_schedule_dict
from siirl.engine.megatron.pipeline import run_pipeline
from siirl.engine.megatron.router_loss import RouterLossLog
from siirl.engine.megatron.router_replay import RoutingReplay
from siirl.engine.megatron.sequence_parallel import sequence_multiple
from siirl.engine.megatron.stages import PipelineStages
from siirl.engine.megatron.weight_sync import iter_pipeline_hf_weights


class MegatronBackend:
    """``module`` trains (the GPT stage, or the critic's value model around it);
    ``schedule_model`` is the GPT stage the schedule runs (default: ``module``)."""

    sharded = False  # megatron shards by tensor/pipeline parallelism, not FSDP
    token_plans = True  # micro-batches may be cut by tokens (dynamic batch size)

    def __init__(self, module: torch.nn.Module, optimizer: Any = None, *,
                 schedule_model: Optional[torch.nn.Module] = None, dp_rank: int = 0,
                 dp_size: int = 1, dp_group: Any = None, tp_group: Any = None,
                 ep_group: Any = None, grad_clip: Any = 1.0,
                 grad_sync: Optional[Callable[[], None]] = None,
                 replicated: Optional[Dict[str, torch.nn.Module]] = None,
                 hf_module: Optional[torch.nn.Module] = None,
                 export_dtype: Optional[torch.dtype] = None, lora: Any = None,
                 merge_on_export: bool = False, packing: bool = False,
                 offload: Optional[Offloader] = None,
                 forward_context: Optional[Callable[[], Any]] = None):
        self.module, self.optimizer = module, optimizer
        # what every stage's schedule runs in (a LoRA reference: the adapters off)
        self.forward_context = forward_context or nullcontext
        # megatron.param_offload / grad_offload / optimizer_offload (megatron.offload): the
        # verbs fetch what they touch, the engines' verbs park it again
        self.offload = offload
        self.schedule_model = schedule_model if schedule_model is not None else module
        self.dp_rank, self.dp_size, self.dp_group = dp_rank, dp_size, dp_group
        self.tp_group, self.grad_clip = tp_group, grad_clip
        # the experts' own tensor-and-model-parallel group (ETP x EP): the grad norm's
        self.ep_group = ep_group
        # averages gradients over data parallelism when megatron's DDP does not
        self.grad_sync = grad_sync
        self.replicated = replicated or {}  # plain modules beside the GPT (value head)
        # the transformers model the weights are exported as (the rollout's copy)
        self.hf_module = hf_module
        # the dtype the weight sync sends (the rollout's; None: as trained)
        self.export_dtype = export_dtype
        # use_remove_padding: micro-batches run as one packed row (megatron.packing)
        self.packing = packing
        # LoRA (siirl.engine.megatron.lora settings): checkpoints and the HF export hold the
        # adapters only (``merge_on_export``: the merged model too); the rollout gets W + sBA
        self.lora, self.merge_on_export = lora, merge_on_export
        self.stages = PipelineStages(sequence_multiple(model_chunks(self.schedule_model)[0]
                                                       .config))
        # MoE: the router's auxiliary losses of the training micro-batches
        config = model_chunks(self.schedule_model)[0].config
        self.router_losses = RouterLossLog(config.moe_layer_freq) \
            if config.num_moe_experts else None
        self.routing: Optional[RoutingReplay] = None  # router replay R2 (the actor's)
        # fp16: the optimizer that scales the loss; the schedule multiplies each loss by it
        self.loss_scaler = loss_scaler(optimizer)
        if self.loss_scaler is not None:
            for chunk in model_chunks(self.schedule_model):
                chunk.config.grad_scale_func = self.loss_scaler.scale_loss

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    # ---- training verbs ------------------------------------------------------------

    def forward_backward_batch(self, data: Any, micro: Micro, head: Head,
                               loss_fn: Optional[MicroLoss] = None,
                               forward_only: bool = False) -> Optional[Dict[str, torch.Tensor]]:
        """``micro``: rows per micro-batch, or a token plan (dynamic batch size: its
        micro-batches have different rows, which megatron's schedule passes between
        pipeline stages with ``variable_seq_lengths``)."""
        self._fetch(grads=not forward_only)
        device = self.device
        parts, restore = micro_batches(data, micro)
        if isinstance(micro, int):
            schedule = self.stages.micro_batches(data, micro, device)
        else:
            schedule = [self.stages.schedule_dict(part, device) for part in parts]
        if self.packing:
            schedule = [pack_schedule_dict(batch, data[RESPONSES].shape[-1],
                                           self.stages.sequence_multiple)
                        for batch in schedule]
        routed, around = None, None
        if self.routing is not None:  # router replay R2 (megatron.router_replay)
            routed = self.routing.new_record() if forward_only else None
            if not forward_only and ROUTED_EXPERTS in data.keys():
                for batch, part in zip(schedule, parts, strict=True):
                    batch[ROUTED_EXPERTS] = _filled(part[ROUTED_EXPERTS], batch)
            around = self.routing.around_forward(routed)
        if forward_only:
            with self.forward_context():
                outputs = run_pipeline(self.schedule_model, schedule, head.fn,
                                       forward_only=True, around_forward=around)
            rows = data.batch_size[0]
            if routed is not None:
                self.routing.keep(routed, rows, restore)
            shape = (rows, data[RESPONSES].shape[-1])
            result = {}
            for name in head.outputs:
                value = None
                if self.stages.is_last:  # filler rows (PP > 1) dropped, plan order undone
                    value = torch.cat([o[name] for o in outputs])[:rows].float()
                    value = value if restore is None else value[restore]
                result[name] = self.stages.broadcast_rows(value, shape, device).cpu()
            return result

        def step_loss(index: int, outputs: Dict[str, torch.Tensor]) -> torch.Tensor:
            return loss_fn(parts[index], {name: value.float() for name, value in
                                          outputs.items() if value is not None})

        with self.forward_context():
            run_pipeline(self.schedule_model, schedule, head.fn, step_loss,
                         around_forward=around)
        if self.router_losses is not None:
            self.router_losses.record(len(schedule))
        return None

    def take_update_metrics(self, prefix: str) -> Dict[str, float]:
        """Metrics of the update's steps already global over the ranks (the router's
        auxiliary losses as ``<prefix>/moe_aux_loss``, ``<prefix>/moe_z_loss``)."""
        return self.router_losses.take(prefix) if self.router_losses is not None else {}

    def _fetch(self, grads: bool = False, optimizer: bool = False) -> None:
        if self.offload is not None:
            self.offload.fetch(grads, optimizer)

    def zero_grad(self) -> None:
        self._fetch(grads=True, optimizer=True)
        self.optimizer.zero_grad(set_to_none=True)

    def optimizer_step(self) -> float:
        self._fetch(grads=True, optimizer=True)
        if isinstance(self.optimizer, MegatronOptimizer):
            # gradients were reduced by the schedule's finalize_model_grads
            return self.optimizer.step_if_finite()
        if self.grad_sync is not None:
            self.grad_sync()
        if self.loss_scaler is None:
            return step_if_finite(self.optimizer, clip_grad_norm(
                self.module, self.grad_clip, self.tp_group, self.stages.group, self.ep_group))
        # fp16: the gradients are the loss scale times the true ones; clip them at that
        # multiple of grad_clip, then megatron's step unscales them (skipping on inf/NaN)
        scale = float(self.loss_scaler.get_loss_scale())
        clip = float(self.grad_clip) * scale if self.grad_clip and self.grad_clip > 0 else 0.0
        norm = clip_grad_norm(self.module, clip, self.tp_group, self.stages.group,
                              self.ep_group) / scale
        stepped, _norm, _zeros = self.optimizer.step()
        if not stepped:
            self.optimizer.zero_grad(set_to_none=True)
            return math.inf
        return norm

    def share_metrics(self, metrics: Dict[str, float]) -> Dict[str, float]:
        return self.stages.broadcast_metrics(metrics)

    # ---- persistence ---------------------------------------------------------------

    def save_checkpoint(self, directory: str, extra: Dict[str, Any],
                        contents: Tuple[str, ...]) -> None:
        self._fetch(optimizer=True)
        if self.lora is not None:
            return lora_checkpoint.save_checkpoint(directory, self, extra, contents)
        checkpointing.save_checkpoint(directory, self.schedule_model, self.optimizer, extra,
                                      contents, self.dp_rank, self.replicated)

    def load_checkpoint(self, directory: str, contents: Tuple[str, ...]) -> Dict[str, Any]:
        self._fetch(optimizer=True)
        if self.lora is not None:
            return lora_checkpoint.load_checkpoint(directory, self, contents)
        return checkpointing.load_checkpoint(directory, self.schedule_model, self.optimizer,
                                             contents, self.replicated)

    def export_weights(self, bucket_bytes: int) -> Iterator[Bucket]:
        """HF-named full tensors of the whole model, in buckets, on every rank (collective
        over the tensor- and pipeline-parallel groups), in ``export_dtype``."""
        with self.holding():  # parked again once the last bucket is taken
            self._fetch()
            yield from self._export_weights(bucket_bytes)

    def holding(self) -> Any:
        """What an engine verb runs in (megatron.offload: park again when it ends)."""
        return self.offload.hold() if self.offload is not None else nullcontext()

    def _export_weights(self, bucket_bytes: int) -> Iterator[Bucket]:
        buckets = iter_pipeline_hf_weights(self.schedule_model, self.hf_module.config,
                                           bucket_bytes,
                                           tp_group=self.tp_group, stages=self.stages) \
            if self.lora is None else iter_merged_hf_weights(
                self.schedule_model, self.hf_module.config, bucket_bytes, self.tp_group,
                self.stages)
        dtype = self.export_dtype
        for bucket in buckets:
            yield bucket if dtype is None else [(name, tensor.to(dtype))
                                                for name, tensor in bucket]

    def export_hf(self, directory: str, tokenizer: Any) -> None:
        """The HF copy refreshed from the megatron weights (collective), saved as a
        transformers directory by global rank 0 (LoRA: lora_checkpoint.export_hf)."""
        self._fetch()
        if self.lora is not None:
            return lora_checkpoint.export_hf(directory, self, tokenizer, self.merge_on_export)
        copy_into(self.hf_module, self.export_weights(DEFAULT_BUCKET_BYTES))
        if torch.distributed.get_rank() == 0:
            ckpt.save_pretrained_dir(directory, self.hf_module, self.hf_module.state_dict(),
                                     tokenizer)
        torch.distributed.barrier()


def _filled(routed: torch.Tensor, batch: dict) -> torch.Tensor:
    """A micro-batch's routing for its schedule dict's rows (at PP > 1 a short micro-batch
    is filled with copies of its last row, see PipelineStages.micro_batches)."""
    rows = batch[ROW_MASK] if ROW_MASK in batch else batch["input_ids"]  # packed: its rows
    short = rows.shape[0] - routed.shape[0]
    return torch.cat([routed, routed[-1:].expand(short, *routed.shape[1:])]) if short > 0 \
        else routed
