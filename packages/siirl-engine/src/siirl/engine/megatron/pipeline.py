"""Pipeline-parallel log-prob forward / backward on a megatron GPT stage.

:func:`pipeline_logprob_step` runs megatron-core's own schedule
(``megatron.core.pipeline_parallel.get_forward_backward_func()``: 1F1B when PP > 1, plain
micro-batch accumulation when PP = 1) over left-padded ``[B, S]`` micro-batches; on the last
stage it turns logits into per-token log-probs of the response and hands them to a loss
function. On CPU (gloo) call :func:`siirl.engine.megatron.cpu_compat.enable_cpu_mode` first:
it adapts the schedule's and the p2p layer's CUDA allocations.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from siirl.engine.megatron.model import forward_logits, megatron_attention_mask, unwrap_model
from siirl.engine.models.logprob import logprobs_from_logits

__all__ = ["pipeline_logprob_step"]

LossFn = Callable[[int, torch.Tensor], torch.Tensor | None]


def _check_micro_batches(micro_batches: Sequence[dict[str, torch.Tensor]]) -> tuple[int, int]:
    if not micro_batches:
        raise ValueError("pipeline_logprob_step needs at least one micro-batch")
    shape = tuple(micro_batches[0]["input_ids"].shape)
    for index, batch in enumerate(micro_batches):
        for key in ("input_ids", "attention_mask", "position_ids"):
            if tuple(batch[key].shape) != shape:
                raise ValueError(f"micro-batch {index}: {key} has shape "
                                 f"{tuple(batch[key].shape)}, expected {shape} (megatron's "
                                 "schedule sends fixed-shape activations)")
    batch_size, seq_len = shape
    return batch_size, seq_len


def pipeline_logprob_step(model: torch.nn.Module,
                          micro_batches: Sequence[dict[str, torch.Tensor]],
                          response_length: int, temperature: float = 1.0,
                          loss_fn: LossFn | None = None,
                          forward_only: bool = False) -> list[dict[str, Any]]:
    """One forward (and, unless ``forward_only``, backward) pass of this rank's pipeline stage
    over ``micro_batches``, scheduled by megatron-core.

    Every stage of the pipeline calls this with the same ``micro_batches``: dicts of
    ``input_ids`` / ``attention_mask`` / ``position_ids``, all ``[B, S]`` with one ``B, S``
    for every micro-batch (left-padded; the mask is 1 on tokens). Only the first stage reads
    the token ids; all stages use the mask and positions.

    On the last stage, micro-batch ``i`` gives ``log_probs [B, R]`` (``R = response_length``,
    float32): the log-probability of tokens ``S-R .. S-1`` under the logits at positions
    ``S-R-1 .. S-2`` divided by ``temperature``, as
    :func:`siirl.engine.models.logprob.logprobs_from_logits` computes them. Then
    ``loss_fn(i, log_probs)`` returns a scalar loss tensor. Gradients are those of the *sum*
    of the micro-batch losses (normalise inside ``loss_fn``, e.g. by the token count of all
    micro-batches); they accumulate into each stage's parameters' ``.grad`` (or megatron
    DDP's ``main_grad``) as ``backward()`` would. With ``forward_only`` the pass runs under
    ``torch.no_grad()``, and ``loss_fn`` may be ``None`` or return ``None``.

    Returns, on the last stage, one dict per micro-batch, in order:
    ``{"log_probs": [B, R] (detached), "loss": scalar (detached) or None}``; on other
    stages an empty list.

    With tied embeddings at PP > 1 the word-embedding gradient is summed between the first
    and last stage afterwards (what megatron's ``finalize_model_grads`` does), unless
    ``config.finalize_model_grads_func`` is set, in which case megatron calls that instead.
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    gpt = unwrap_model(model)
    config = gpt.config
    if parallel_state.get_context_parallel_world_size() != 1:
        raise NotImplementedError("context parallelism is not supported")
    batch_size, seq_len = _check_micro_batches(micro_batches)
    if not 0 < response_length < seq_len:
        raise ValueError(f"response_length={response_length} must be in [1, {seq_len - 1}]")
    if not forward_only and loss_fn is None and gpt.post_process:
        raise ValueError("a loss_fn is needed unless forward_only")
    num_micro_batches = len(micro_batches)
    last_stage = gpt.post_process

    def forward_step(data_iterator, module):
        index, batch = next(data_iterator)
        input_ids = batch["input_ids"]
        attention_mask = batch["attention_mask"]
        position_ids = batch["position_ids"]
        if not last_stage:  # hidden states [S, B, H] for the next stage
            hidden = module(input_ids, position_ids, megatron_attention_mask(attention_mask))
            return hidden, None
        logits = forward_logits(module, input_ids, position_ids, attention_mask)

        def loss_func(output):
            log_probs, _ = logprobs_from_logits(output, input_ids, response_length, temperature)
            loss = loss_fn(index, log_probs) if loss_fn is not None else None
            if loss is None:
                if not forward_only:
                    raise ValueError(f"loss_fn returned None for micro-batch {index}")
                reported, loss = None, log_probs.new_zeros(())
            else:
                reported = loss.detach().clone()
            result = {"log_probs": log_probs.detach(), "loss": reported}
            # megatron divides the returned loss by the number of micro-batches (its
            # "average over micro-batches" convention); undo that so the gradient is the
            # one of the sum of loss_fn's losses.
            return loss * num_micro_batches, result

        return logits, loss_func

    tied = (gpt.share_embeddings_and_output_weights
            and parallel_state.get_pipeline_model_parallel_world_size() > 1
            and not forward_only and config.finalize_model_grads_func is None
            and parallel_state.is_rank_in_embedding_group())
    before = None
    if tied:
        weight = gpt.shared_embedding_or_output_weight()
        before = None if weight.grad is None else weight.grad.detach().clone()

    forward_backward = get_forward_backward_func()
    grad_context = torch.no_grad() if forward_only else contextlib.nullcontext()
    with grad_context:
        outputs = forward_backward(
            forward_step_func=forward_step,
            data_iterator=iter(enumerate(micro_batches)),
            model=[model],
            num_microbatches=num_micro_batches,
            seq_length=seq_len,
            micro_batch_size=batch_size,
            forward_only=forward_only,
        )

    if tied:
        _sum_tied_embedding_grad(gpt.shared_embedding_or_output_weight(), before)
    return list(outputs) if last_stage else []


def _sum_tied_embedding_grad(weight: torch.nn.Parameter, before: torch.Tensor | None) -> None:
    """Sum this call's gradient of the tied embedding between the first and the last stage
    (both hold a copy; each saw only its own use of it). Only the increment of this call is
    exchanged, so gradients accumulated over several calls stay right."""
    grad = weight.grad
    if grad is None:
        grad = weight.grad = torch.zeros_like(weight)
    delta = grad if before is None else grad - before
    delta = delta.contiguous()
    dist.all_reduce(delta, group=parallel_state.get_embedding_group())
    with torch.no_grad():
        grad.copy_(delta if before is None else before + delta)
