"""Pipeline-parallel forward / backward on a megatron GPT stage.

:func:`run_pipeline` runs megatron-core's own schedule
(``megatron.core.pipeline_parallel.get_forward_backward_func()``: 1F1B when PP > 1, plain
micro-batch accumulation when PP = 1) over left-padded ``[B, S]`` micro-batches; on the last
stage a head turns the stage's output into named outputs (per-token log-probs of the
response with :func:`logprob_head`, values for the critic) and a loss function scores them.
On CPU (gloo) call :func:`siirl.engine.megatron.cpu_compat.enable_cpu_mode` first: it
adapts the schedule's and the p2p layer's CUDA allocations.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from siirl.data_coordinator.fields import ATTENTION_MASK, INPUT_IDS, POSITION_IDS
from siirl.engine.megatron.chunks import model_chunks
from siirl.engine.megatron.model import forward_logits, unwrap_model
from siirl.engine.megatron.packing import schedule_attention_mask
from siirl.engine.models.logprob import logprobs_from_logits

__all__ = ["logprob_head", "pipeline_logprob_step", "run_pipeline"]

LossFn = Callable[[int, torch.Tensor], torch.Tensor | None]
# last_stage_fn(module, micro_batch) -> named outputs (the first one is megatron's output
# tensor); step_loss_fn(index, outputs) -> scalar loss or None
LastStageFn = Callable[[torch.nn.Module, dict[str, torch.Tensor]], dict[str, torch.Tensor]]
StepLossFn = Callable[[int, dict[str, torch.Tensor]], torch.Tensor | None]


def _check_micro_batches(micro_batches: Sequence[dict[str, torch.Tensor]]
                         ) -> tuple[int, int, bool]:
    """(rows, length) of the first micro-batch and whether all have that shape."""
    if not micro_batches:
        raise ValueError("a pipeline step needs at least one micro-batch")
    shape = tuple(micro_batches[0][INPUT_IDS].shape)
    equal = True
    for index, batch in enumerate(micro_batches):
        own = tuple(batch[INPUT_IDS].shape)
        for key in (ATTENTION_MASK, POSITION_IDS):
            if tuple(batch[key].shape) != own:
                raise ValueError(f"micro-batch {index}: {key} has shape "
                                 f"{tuple(batch[key].shape)}, its input_ids {own}")
        equal = equal and own == shape
    batch_size, seq_len = shape
    return batch_size, seq_len, equal


@contextlib.contextmanager
def _variable_shapes(chunks: list, on: bool):
    """Megatron's ``variable_seq_lengths`` for one schedule call: the p2p layer sends each
    activation's shape before it, so pipeline stages may pass micro-batches of different
    rows (dynamic batch size) or lengths; off, every stage expects the first's shape."""
    configs = {id(chunk.config): chunk.config for chunk in chunks}.values()
    before = [config.variable_seq_lengths for config in configs]
    for config in configs:
        config.variable_seq_lengths = config.variable_seq_lengths or on
    try:
        yield
    finally:
        for config, value in zip(configs, before, strict=True):
            config.variable_seq_lengths = value


def run_pipeline(model: torch.nn.Module, micro_batches: Sequence[dict[str, torch.Tensor]],
                 last_stage_fn: LastStageFn, loss_fn: StepLossFn | None = None,
                 forward_only: bool = False,
                 around_forward: Callable[[dict, torch.nn.Module], Any] | None = None,
                 ) -> list[dict[str, Any]]:
    """Forward (and, unless ``forward_only``, backward) of this rank's stage over
    ``micro_batches`` with megatron-core's schedule (1F1B at PP > 1, plain accumulation at
    PP = 1). Every stage calls it with the same micro-batches (dicts of ``input_ids``,
    ``attention_mask``, ``position_ids``, ``[B, S]`` left-padded; ``B, S`` may differ between
    micro-batches: at PP > 1 stages then exchange shapes first). Inner stages run the
    decoder; the last stage calls ``last_stage_fn(module, batch)`` for named outputs and
    ``loss_fn(index, outputs)`` for a scalar loss. ``around_forward(batch, module)``, where
    given, is a context each stage (each chunk ``module``) runs its forward of ``batch`` in.

    Gradients are those of the *sum* of the losses (normalise inside ``loss_fn``); they
    accumulate into ``.grad`` as ``backward()`` would. Returns, on the last stage, one dict
    per micro-batch: the outputs detached, plus ``"loss"`` (detached, or None when
    ``forward_only`` and ``loss_fn`` gives none); on other stages an empty list.

    With tied embeddings at PP > 1 the word-embedding gradient is summed between the first
    and last stage afterwards (what megatron's ``finalize_model_grads`` does), unless
    ``config.finalize_model_grads_func`` is set, in which case megatron calls that instead.
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    chunks = [unwrap_model(chunk) for chunk in model_chunks(model)]
    config = chunks[0].config
    if parallel_state.get_context_parallel_world_size() != 1:
        raise NotImplementedError("context parallelism is not supported")
    pp_size = parallel_state.get_pipeline_model_parallel_world_size()
    batch_size, seq_len, equal_shapes = _check_micro_batches(micro_batches)
    last_stage = parallel_state.is_pipeline_last_stage()
    if not forward_only and loss_fn is None and last_stage:
        raise ValueError("a loss_fn is needed unless forward_only")
    num_real = len(micro_batches)
    micro_batches = _pad_for_interleaving(list(micro_batches), len(chunks), pp_size)
    num_micro_batches = len(micro_batches)

    def forward_step(data_iterator, module):
        index, batch = next(data_iterator)
        # every stage's forward of a micro-batch (router replay records or replays there)
        with around_forward(batch, module) if around_forward else contextlib.nullcontext():
            if not unwrap_model(module).post_process:  # hidden states [S, B, H] onwards
                hidden = module(batch[INPUT_IDS], batch[POSITION_IDS],
                                schedule_attention_mask(batch))
                return hidden, None
            outputs = last_stage_fn(module, batch)

        def loss_func(_output):
            if index >= num_real:  # filler for the interleaved schedule: no gradient
                first = next(iter(outputs.values()))
                return first.sum() * 0.0, {}
            loss = loss_fn(index, outputs) if loss_fn is not None else None
            if loss is None:
                if not forward_only:
                    raise ValueError(f"loss_fn returned None for micro-batch {index}")
                reported, loss = None, next(iter(outputs.values())).new_zeros(())
            else:
                reported = loss.detach().clone()
            result = {name: value.detach() for name, value in outputs.items()
                      if value is not None}
            result["loss"] = reported
            # megatron divides the returned loss by the number of micro-batches (its
            # "average over micro-batches" convention); undo that so the gradient is the
            # one of the sum of loss_fn's losses.
            return loss * num_micro_batches, result

        return next(iter(outputs.values())), loss_func

    tied_weight = _tied_embedding(chunks, pp_size, forward_only, config)
    before = None
    if tied_weight is not None and tied_weight.grad is not None:
        before = tied_weight.grad.detach().clone()

    forward_backward = get_forward_backward_func()
    grad_context = torch.no_grad() if forward_only else contextlib.nullcontext()
    iterators = [iter(enumerate(micro_batches)) for _ in chunks]
    with grad_context, _variable_shapes(chunks, not equal_shapes):
        outputs = forward_backward(
            forward_step_func=forward_step,
            data_iterator=iterators if len(chunks) > 1 else iterators[0],
            model=model_chunks(model),
            num_microbatches=num_micro_batches,
            seq_length=seq_len,
            micro_batch_size=batch_size,
            forward_only=forward_only,
        )

    if tied_weight is not None:
        _sum_tied_embedding_grad(tied_weight, before)
    return list(outputs)[:num_real] if last_stage else []


def _pad_for_interleaving(micro_batches: list, num_chunks: int, pp_size: int) -> list:
    """The interleaved schedule runs micro-batches in groups of ``pp_size``: fill the list
    up to a multiple of it with copies of the last micro-batch (their losses are zero)."""
    if num_chunks == 1:
        return micro_batches
    short = -len(micro_batches) % pp_size
    return micro_batches + [micro_batches[-1]] * short


def _tied_embedding(chunks: list, pp_size: int, forward_only: bool, config: Any):
    """The copy of the tied word embedding this rank holds when its gradient must be summed
    with the other copy's (first and last stage at PP > 1), else None (also when it is
    frozen, as under LoRA)."""
    if (pp_size == 1 or forward_only or config.finalize_model_grads_func is not None
            or not parallel_state.is_rank_in_embedding_group()):
        return None
    for chunk in chunks:
        if chunk.share_embeddings_and_output_weights and (chunk.pre_process
                                                          or chunk.post_process):
            weight = chunk.shared_embedding_or_output_weight()
            return weight if weight.requires_grad else None
    return None


def logprob_head(response_length: int, temperature: float = 1.0,
                 calculate_entropy: bool = False) -> LastStageFn:
    """Last-stage outputs ``log_probs [B, R]`` (float32; and ``entropy [B, R]`` when asked)
    of the response, as :func:`siirl.engine.models.logprob.logprobs_from_logits` computes
    them from the stage's logits."""

    def head(module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        seq_len = batch[INPUT_IDS].shape[1]
        if not 0 < response_length < seq_len:
            raise ValueError(f"response_length={response_length} must be in [1, {seq_len - 1}]")
        logits = forward_logits(module, batch[INPUT_IDS], batch[POSITION_IDS],
                                batch[ATTENTION_MASK])
        log_probs, entropy = logprobs_from_logits(logits, batch[INPUT_IDS], response_length,
                                                  temperature, calculate_entropy)
        return {"log_probs": log_probs, "entropy": entropy}

    return head


def pipeline_logprob_step(model: torch.nn.Module,
                          micro_batches: Sequence[dict[str, torch.Tensor]],
                          response_length: int, temperature: float = 1.0,
                          loss_fn: LossFn | None = None,
                          forward_only: bool = False) -> list[dict[str, Any]]:
    """:func:`run_pipeline` with the log-prob head: on the last stage micro-batch ``i``
    gives ``log_probs [B, R]`` (``R = response_length``): the log-probability of tokens
    ``S-R .. S-1`` under the logits at ``S-R-1 .. S-2`` divided by ``temperature``; then
    ``loss_fn(i, log_probs)`` returns a scalar loss. Returns, on the last stage,
    ``{"log_probs", "loss"}`` per micro-batch; on other stages an empty list."""
    seq_len = micro_batches[0][INPUT_IDS].shape[1] if micro_batches else 0
    if micro_batches and not 0 < response_length < seq_len:
        raise ValueError(f"response_length={response_length} must be in [1, {seq_len - 1}]")
    step_loss = None
    if loss_fn is not None:
        def step_loss(index: int, outputs: dict[str, torch.Tensor]) -> torch.Tensor | None:
            return loss_fn(index, outputs["log_probs"])
    return run_pipeline(model, micro_batches, logprob_head(response_length, temperature),
                        step_loss, forward_only)


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
