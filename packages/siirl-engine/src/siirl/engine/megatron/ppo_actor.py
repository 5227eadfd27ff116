"""The PPO actor on a megatron GPT stage, scheduled by megatron's pipeline schedule.

``MegatronPPOActor`` keeps ``DataParallelPPOActor``'s mini-batch loop, loss weighting and
metrics; what changes is how a mini-batch's micro-batches run: all of them go through
:func:`~siirl.engine.megatron.pipeline.run_pipeline` at once (1F1B over the pipeline
stages at PP > 1), the PPO loss of micro-batch ``i`` is computed on the last stage as the
schedule's loss function, and log-probs and metrics are broadcast from the last stage to
the other stages. The gradient norm is taken over tensor- and pipeline-parallel shards.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Dict

import torch

from siirl.data_coordinator.protocol import split
from siirl.engine.actor.dp_actor import _FORWARD_KEYS, DataParallelPPOActor
from siirl.engine.dp_utils import clip_grad_norm, require
from siirl.engine.megatron.chunks import model_chunks
from siirl.engine.megatron.optimizer_adapter import MegatronOptimizer
from siirl.engine.megatron.pipeline import logprob_head, run_pipeline
from siirl.engine.megatron.sequence_parallel import sequence_multiple
from siirl.engine.megatron.stages import PipelineStages
from siirl.execution.config_select import select


class MegatronPPOActor(DataParallelPPOActor):
    """``DataParallelPPOActor`` whose ``module`` is this rank's GPTModel stage."""

    def __init__(self, module: torch.nn.Module, actor_cfg: Any, temperature: float = 1.0,
                 **kwargs: Any):
        super().__init__(module, actor_cfg, temperature, **kwargs)
        self.stages = PipelineStages(sequence_multiple(model_chunks(module)[0].config))

    @torch.no_grad()
    def compute_log_prob(self, batch: Any, calculate_entropy: bool = False):
        require(batch, _FORWARD_KEYS, "compute_log_prob")
        data = batch.select(*_FORWARD_KEYS)
        rows = data.batch_size[0]
        response_length = data["responses"].shape[-1]
        micro_rows = int(self.log_prob_micro_batch_size or rows or 1)
        self.module.eval()
        outputs = run_pipeline(
            self.module, self.stages.micro_batches(data, micro_rows, self._device()),
            logprob_head(response_length, self.temperature, calculate_entropy),
            forward_only=True)
        shape = (rows, response_length)
        log_probs = entropy = None
        if self.stages.is_last:
            log_probs = torch.cat([o["log_probs"] for o in outputs])[:rows].float()
            if calculate_entropy:
                entropy = torch.cat([o["entropy"] for o in outputs])[:rows].float()
        log_probs = self.stages.broadcast_rows(log_probs, shape, self._device()).cpu()
        if calculate_entropy:
            entropy = self.stages.broadcast_rows(entropy, shape, self._device()).cpu()
        return log_probs, entropy

    def update_policy(self, batch: Any) -> Dict[str, float]:
        return self.stages.broadcast_metrics(super().update_policy(batch))

    def _update_mini_batch(self, mini_batch: Any, micro: int, use_kl: bool,
                           stats: Dict[str, list]) -> bool:
        mini_batch = mini_batch.to(self._device())
        micro_batches = split(mini_batch, micro)  # equal sizes: micro divides the mini-batch
        loss_of = self._micro_loss_fn(mini_batch, len(micro_batches), use_kl)
        totals: Dict[str, float] = defaultdict(float)

        def step_loss(index: int, outputs: Dict[str, torch.Tensor]) -> torch.Tensor:
            return loss_of(micro_batches[index], outputs["log_probs"], outputs["entropy"],
                           totals)

        self.optimizer.zero_grad(set_to_none=True)
        run_pipeline(self.module,
                     self.stages.micro_batches(mini_batch, micro, self._device()),
                     logprob_head(mini_batch["responses"].shape[-1], self.temperature,
                                  calculate_entropy=True),
                     step_loss)
        return self._finish_mini_batch(totals, stats)

    def _finish_mini_batch(self, totals: Dict[str, float], stats: Dict[str, list]) -> bool:
        if not isinstance(self.optimizer, MegatronOptimizer):
            return super()._finish_mini_batch(totals, stats)
        # gradients were reduced by the schedule's finalize_model_grads
        for key, value in totals.items():
            stats[key].append(value)
        grad_norm = self.optimizer.step_if_finite()
        if not math.isfinite(grad_norm):
            return False
        stats["actor/grad_norm"].append(grad_norm)
        return True

    def _clip_grad_norm(self) -> float:
        return clip_grad_norm(self.module, select(self.config, "grad_clip", 1.0), self.tp_group,
                              self.stages.group)
