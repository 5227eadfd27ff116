"""The PPO critic on a megatron GPT stage, scheduled by megatron's pipeline schedule.

Like :mod:`siirl.engine.megatron.ppo_actor` for the actor: ``DataParallelPPOCritic``'s
mini-batch loop and loss weighting, micro-batches run by
:func:`~siirl.engine.megatron.pipeline.run_pipeline`, the value head (which only the last
stage uses) and the value loss on the last stage, values and metrics broadcast from there.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict

import torch

from siirl.data_coordinator.protocol import split
from siirl.engine.critic.dp_critic import _FORWARD_KEYS, DataParallelPPOCritic
from siirl.engine.critic.value_model import response_values
from siirl.engine.dp_utils import clip_grad_norm, require
from siirl.engine.megatron.chunks import model_chunks
from siirl.engine.megatron.pipeline import run_pipeline
from siirl.engine.megatron.sequence_parallel import sequence_multiple
from siirl.engine.megatron.stages import PipelineStages
from siirl.execution.config_select import select


def value_head(value_model: torch.nn.Module, response_length: int):
    """Last-stage outputs ``values [B, R]`` of the value model whose backbone is the
    scheduled GPT stage."""

    def head(_stage: torch.nn.Module, batch: Dict[str, torch.Tensor]) -> Dict[str, Any]:
        return {"values": response_values(value_model, batch["input_ids"],
                                          batch["attention_mask"], batch["position_ids"],
                                          response_length)}

    return head


class MegatronPPOCritic(DataParallelPPOCritic):
    """``module`` is the ValueModel; ``stage`` the GPTModel stage inside its backbone."""

    def __init__(self, module: torch.nn.Module, critic_cfg: Any, *, stage: torch.nn.Module,
                 **kwargs: Any):
        super().__init__(module, critic_cfg, **kwargs)
        self.stage = stage
        self.stages = PipelineStages(sequence_multiple(model_chunks(stage)[0].config))

    @torch.no_grad()
    def compute_values(self, batch: Any) -> torch.Tensor:
        require(batch, _FORWARD_KEYS, "compute_values")
        data = batch.select(*_FORWARD_KEYS)
        rows = data.batch_size[0]
        response_length = data["responses"].shape[-1]
        self.module.eval()
        micro_rows = int(self.forward_micro_batch_size or rows or 1)
        outputs = run_pipeline(self.stage,
                               self.stages.micro_batches(data, micro_rows, self._device()),
                               value_head(self.module, response_length), forward_only=True)
        values = (torch.cat([o["values"] for o in outputs])[:rows].float()
                  if self.stages.is_last else None)
        values = self.stages.broadcast_rows(values, (rows, response_length),
                                            self._device()).cpu()
        if "response_mask" in batch.keys():
            values = values * batch["response_mask"].to(values.dtype)
        return values

    def update_critic(self, batch: Any) -> Dict[str, float]:
        return self.stages.broadcast_metrics(super().update_critic(batch))

    def _update_mini_batch(self, mini_batch: Any, micro: int, stats: Dict[str, list]) -> bool:
        mini_batch = mini_batch.to(self._device())
        micro_batches = split(mini_batch, micro)  # equal sizes: micro divides the mini-batch
        loss_of = self._micro_loss_fn(mini_batch)
        totals: Dict[str, float] = defaultdict(float)

        def step_loss(index: int, outputs: Dict[str, torch.Tensor]) -> torch.Tensor:
            return loss_of(micro_batches[index], outputs["values"].float(), totals)

        self.optimizer.zero_grad(set_to_none=True)
        run_pipeline(self.stage, self.stages.micro_batches(mini_batch, micro, self._device()),
                     value_head(self.module, mini_batch["responses"].shape[-1]), step_loss)
        return self._finish_mini_batch(totals, stats)

    def _clip_grad_norm(self) -> float:
        return clip_grad_norm(self.module, select(self.config, "grad_clip", 1.0), self.tp_group,
                              self.stages.group)
