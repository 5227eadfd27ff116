"""What the megatron actor and critic need to know about pipeline stages: which stage this
rank is, how batches become the schedule's micro-batches, and how results computed on the
last stage reach the other stages (every worker of a pipeline hands the same rows on, so
every stage must hold the log-probs, values and metrics the last one computed)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from siirl.data_coordinator.fields import ATTENTION_MASK, INPUT_IDS, POSITION_IDS

_SCHEDULE_KEYS = (INPUT_IDS, ATTENTION_MASK, POSITION_IDS)


class PipelineStages:
    """This rank's place in megatron's pipeline (a trivial pipeline of one stage at PP=1)."""

    def __init__(self, sequence_multiple: int = 1) -> None:
        from megatron.core import parallel_state as ps

        self.sequence_multiple = sequence_multiple  # sequence parallelism: TP size

        self.size = ps.get_pipeline_model_parallel_world_size()
        self.rank = ps.get_pipeline_model_parallel_rank()
        self.group = ps.get_pipeline_model_parallel_group() if self.size > 1 else None
        self.is_first = self.rank == 0
        self.is_last = self.rank == self.size - 1
        self.last_global_rank = (ps.get_pipeline_model_parallel_last_rank()
                                 if self.size > 1 else None)

    def global_rank(self, stage: int) -> int:
        return dist.get_global_rank(self.group, stage)

    def micro_batches(self, data: Any, rows: int, device: torch.device
                      ) -> List[Dict[str, torch.Tensor]]:
        """``data`` split into micro-batches of ``rows`` rows as the schedule's dicts. At
        PP > 1 activations between stages have one shape, so a short last micro-batch is
        filled up with copies of its last row (callers drop those rows' results). With
        sequence parallelism, sequences are left-padded to a multiple of the TP size."""
        total = data.batch_size[0]
        out = []
        for start in range(0, total, rows):
            micro = self.schedule_dict(data[start:start + rows], device)
            short = rows - micro[INPUT_IDS].shape[0]
            if short and self.size > 1:
                micro = {key: torch.cat([value, value[-1:].expand(short, -1)])
                         for key, value in micro.items()}
            out.append(micro)
        return out

    def schedule_dict(self, rows: Any, device: torch.device) -> Dict[str, torch.Tensor]:
        """One micro-batch of ``rows`` as the schedule's dict (with sequence parallelism
        left-padded to a multiple of the TP size: masked, position 0, so the response
        positions stay where they were)."""
        micro = {key: rows[key].to(device) for key in _SCHEDULE_KEYS}
        extra = -micro[INPUT_IDS].shape[1] % self.sequence_multiple
        if extra:
            micro = {key: torch.nn.functional.pad(value, (extra, 0))
                     for key, value in micro.items()}
        return micro

    def broadcast_rows(self, tensor: Optional[torch.Tensor], shape: tuple,
                       device: torch.device) -> torch.Tensor:
        """The last stage's fp32 ``tensor`` of ``shape`` on every stage."""
        if self.size == 1:
            return tensor
        if not self.is_last:
            tensor = torch.empty(shape, dtype=torch.float32, device=device)
        tensor = tensor.to(device).contiguous()
        dist.broadcast(tensor, src=self.last_global_rank, group=self.group)
        return tensor

    def broadcast_metrics(self, metrics: Dict[str, float]) -> Dict[str, float]:
        """The last stage's metrics on every stage; values that every stage computed (the
        grad norm, the skip count, the lr) are equal on all stages anyway."""
        if self.size == 1:
            return metrics
        holder = [metrics if self.is_last else None]
        dist.broadcast_object_list(holder, src=self.last_global_rank, group=self.group)
        return holder[0]
