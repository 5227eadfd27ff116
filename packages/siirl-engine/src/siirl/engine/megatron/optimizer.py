"""megatron-core's data-parallel wrapper and (distributed) optimizer for one GPTModel stage.

:func:`build_distributed_optimizer` wraps a stage in megatron's ``DistributedDataParallel``
(contiguous fp32 grad buffers, bucketed all-reduce / reduce-scatter over the data-parallel
group) and builds megatron's optimizer over it: with ``use_distributed_optimizer=True`` the
``DistributedOptimizer`` (ZeRO-1: each data-parallel rank keeps Adam moments for, and
updates, only its shard of the grad buffer, then the updated parameters are all-gathered),
otherwise megatron's plain ``FP32Optimizer``. One training step::

    zero_grad(ddp_model, optimizer)
    loss = ...forward(ddp_model, ...)          # any number of micro-batches
    loss.backward()                            # grads land in param.main_grad (not .grad)
    finish_grad_sync(ddp_model)                # data-parallel reduction (+ embedding / SP syncs)
    update_ok, grad_norm, num_zeros = optimizer_step(optimizer)

Megatron's DDP *averages* gradients over data-parallel ranks, so a rank's loss must be
scaled so that the average of the ranks' losses is the global loss (e.g. a token sum
divided by the global token count, times the data-parallel size).

Parameters are fp32, or bf16 (a model built with ``params_dtype=torch.bfloat16``): then
megatron's mixed-precision optimizers keep fp32 main copies (``DistributedOptimizer``: of
this rank's shard; ``Float16OptimizerWithFloat16Params``: of every parameter), gradients
accumulate and are reduced in fp32 (``grad_reduce_in_fp32``), Adam steps the fp32 copies and
the bf16 weights are copied back from them; fp16 the same, with megatron's dynamic loss
scaling (siirl.engine.megatron.mixed_precision.LOSS_SCALING). On
CPU (gloo) call :func:`siirl.engine.megatron.cpu_compat.enable_cpu_mode` first; it adapts
the few megatron functions of this path that allocate on CUDA.

With pipeline parallelism, set ``config.finalize_model_grads_func = finalize_model_grads``
(megatron's) on the model config: under DDP the gradients live in ``param.main_grad``, so
the schedule must let megatron sum the tied-embedding grads, not the ``.grad``-based
fallback in :mod:`siirl.engine.megatron.pipeline`.
"""

from __future__ import annotations

from typing import Any

import torch

from siirl.engine.megatron.joint_loss_scale import share_loss_scale
from siirl.engine.megatron.mixed_precision import LOSS_SCALING

__all__ = ["build_distributed_optimizer", "finish_grad_sync", "load_optimizer_checkpoint",
           "optimizer_state_dict", "optimizer_step", "save_optimizer_checkpoint", "zero_grad"]


def build_distributed_optimizer(model: torch.nn.Module, *, lr: float,
                                betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                                weight_decay: float = 0.0, clip_grad: float = 1.0,
                                use_distributed_optimizer: bool = True,
                                bucket_size: int | None = None,
                                ddp_overrides: dict[str, Any] | None = None,
                                optimizer_overrides: dict[str, Any] | None = None):
    """Wrap ``model`` (one GPTModel stage, fp32 or bf16 params, model-parallel state set up) in
    megatron's DDP and build megatron's Adam(W) over it. Returns ``(ddp_model, optimizer)``.

    Adam is megatron's ``optimizer='adam'`` with decoupled weight decay, i.e. AdamW (TE's or
    apex's FusedAdam when installed, else ``torch.optim.AdamW``); ``clip_grad`` is the max
    global grad norm (0 disables clipping). ``bucket_size`` (elements) defaults to one
    bucket per dtype. Grad sync is synchronous (no overlap with backward) and reduces in
    fp32. ``ddp_overrides`` / ``optimizer_overrides`` go to ``DistributedDataParallelConfig``
    / ``OptimizerConfig``. The optimizer is megatron's ``ChainedOptimizer`` around one
    ``DistributedOptimizer`` (or ``FP32Optimizer``; ``Float16OptimizerWithFloat16Params`` for
    bf16 parameters) per parameter group kind.
    """
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    if isinstance(model, DistributedDataParallel):
        raise TypeError("model is already wrapped in megatron's DistributedDataParallel")
    params = [p for p in model.parameters() if p.requires_grad]
    dtypes = {p.dtype for p in params}
    if dtypes not in ({torch.float32}, {torch.bfloat16}, {torch.float16}):
        raise NotImplementedError(f"fp32, bf16 or fp16 parameters (one dtype for the whole "
                                  f"model), got {sorted(map(str, dtypes))}")
    params_dtype = dtypes.pop()
    config = model.config
    ddp_kwargs: dict[str, Any] = dict(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        overlap_param_gather=False,
        use_distributed_optimizer=use_distributed_optimizer,
        check_for_nan_in_grad=False,
        bucket_size=bucket_size,
    )
    ddp_kwargs.update(ddp_overrides or {})
    ddp_model = DistributedDataParallel(config, DistributedDataParallelConfig(**ddp_kwargs), model)
    opt_kwargs: dict[str, Any] = dict(
        optimizer="adam",
        lr=lr,
        min_lr=lr,
        weight_decay=weight_decay,
        adam_beta1=betas[0],
        adam_beta2=betas[1],
        adam_eps=eps,
        clip_grad=clip_grad,
        use_distributed_optimizer=use_distributed_optimizer,
        params_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,  # fp32 main params, no loss scaling
        fp16=params_dtype == torch.float16,  # fp32 main params, dynamic loss scaling
        **(LOSS_SCALING if params_dtype == torch.float16 else {}),  # overrides may change
        decoupled_weight_decay=True,
    )
    opt_kwargs.update(optimizer_overrides or {})
    optimizer = get_megatron_optimizer(OptimizerConfig(**opt_kwargs), [ddp_model])
    share_loss_scale(optimizer)  # fp16 MoE: the dense and expert optimizers scale as one
    return ddp_model, optimizer


def zero_grad(ddp_model: torch.nn.Module, optimizer) -> None:
    """Start a step: zero DDP's contiguous grad buffers (every ``param.main_grad``) and the
    optimizer's grads (its shard views / ``.grad`` fields)."""
    ddp_model.zero_grad_buffer()
    optimizer.zero_grad()


def finish_grad_sync(ddp_model: torch.nn.Module, num_tokens: torch.Tensor | None = None) -> None:
    """Megatron's ``finalize_model_grads``: the data-parallel reduction of every bucket
    (reduce-scatter for the distributed optimizer, else all-reduce; averaged over the
    data-parallel ranks), then layer-norm grads over TP for sequence parallelism and the
    tied / position embedding grads between the first and last pipeline stage.
    ``num_tokens`` (global token count), when given, divides every grad by it."""
    from megatron.core.distributed import finalize_model_grads

    finalize_model_grads([ddp_model], num_tokens=num_tokens)


def optimizer_step(optimizer) -> tuple[bool, float | None, int | None]:
    """One update: ``(update_successful, grad_norm, num_zeros_in_grad)`` from megatron's
    ``optimizer.step()``. ``grad_norm`` is the global (all ranks, pre-clipping) L2 norm;
    with the distributed optimizer the updated parameters are all-gathered back into every
    rank's model before this returns."""
    update_successful, grad_norm, num_zeros = optimizer.step()
    return bool(update_successful), grad_norm, num_zeros


def optimizer_state_dict(optimizer, ddp_model: torch.nn.Module, is_loading: bool = False,
                         sharding_type: str = "dp_reshardable") -> dict[str, Any]:
    """The optimizer's ``sharded_state_dict`` for ``megatron.core.dist_checkpointing``
    save / load, keyed against the (unwrapped) model's own sharded state dict. Pass
    ``is_loading=True`` for the template to load into, then ``optimizer.load_state_dict`` the
    loaded dict.

    A fresh optimizer (no step taken) gets its Adam state allocated first when megatron fell
    back to ``torch.optim.AdamW`` (no TE / apex): megatron's ``DistributedOptimizer.state_dict``
    reads the per-parameter ``step`` of that state and asserts there is exactly one value,
    which fails on an empty state (any device, not a CPU matter).

    ``sharding_type`` is the distributed optimizer's format: ``"dp_reshardable"`` (megatron-LM's
    default: each rank saves its own buffer shards; reloadable with another DP size only via
    megatron's resharding) or ``"fully_reshardable"`` (gathered into per-parameter tensors on
    DP rank 0 on save). megatron-core 0.16's own default for this method,
    ``"fully_sharded_model_space"``, builds ``ShardedTensor``s with ``flattened_range``, which
    0.16's ``dist_checkpointing`` rejects ("ShardedTensor.flattened_range is not supported").
    """
    from siirl.engine.megatron.model import unwrap_model

    if is_loading:
        _allocate_torch_adam_state(optimizer)
    model_sharded = unwrap_model(ddp_model).sharded_state_dict()
    return optimizer.sharded_state_dict(model_sharded, is_loading=is_loading,
                                        metadata={"distrib_optim_sharding_type": sharding_type})



def save_optimizer_checkpoint(optimizer, ddp_model: torch.nn.Module, directory: str,
                              sharding_type: str = "dp_reshardable") -> None:
    """``dist_checkpointing.save`` of :func:`optimizer_state_dict` into an existing empty
    ``directory`` (collective: every rank calls it)."""
    from megatron.core import dist_checkpointing

    dist_checkpointing.save(optimizer_state_dict(optimizer, ddp_model,
                                                 sharding_type=sharding_type), directory)


def load_optimizer_checkpoint(optimizer, ddp_model: torch.nn.Module, directory: str,
                              sharding_type: str = "dp_reshardable") -> None:
    """Load what :func:`save_optimizer_checkpoint` wrote (same parallel layout): the Adam
    moments and step, the param-group settings, and the main params. For fp32 training with
    the distributed optimizer those are this rank's shards of the model weights themselves;
    for bf16 the fp32 main copies, from which the bf16 weights are copied as after every
    step: the weights come back too (the shards are all-gathered afterwards).

    Two repairs of megatron-core 0.16's load path (any device):

    * the copy runs under ``no_grad``: ``DistributedOptimizer._set_main_param_and_optimizer_
      states`` ``copy_``s into views of the ``requires_grad`` fp32 parameters, which autograd
      refuses outside ``no_grad`` ("a view of a leaf Variable that requires grad...");
    * with ``torch.optim.AdamW`` (no TE / apex) that same function also copies the per-param
      ``step`` from the load template (the pre-load value, a non-persistent entry) over the
      step ``load_state_dict`` had just restored; the checkpoint's step is put back here.
    """
    from megatron.core import dist_checkpointing

    template = optimizer_state_dict(optimizer, ddp_model, is_loading=True,
                                    sharding_type=sharding_type)
    state = dist_checkpointing.load(template, directory)
    subs = getattr(optimizer, "chained_optimizers", [optimizer])
    sub_states = [state] if len(subs) == 1 else [state[i] for i in range(len(subs))]
    steps = [_saved_step(sub_state) for sub_state in sub_states]
    with torch.no_grad():
        optimizer.load_state_dict(state)
    for sub, step in zip(subs, steps, strict=True):
        inner = getattr(sub, "optimizer", None)
        if step is not None and isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)):
            for param_state in inner.state.values():
                param_state["step"] = torch.tensor(float(step))
    for sub in subs:
        if sub.config.bf16:  # the bf16 weights are the fp32 main weights rounded
            sub._copy_main_params_to_model_params()  # (megatron's own copy of every step)
    if ddp_model.ddp_config.use_distributed_optimizer:
        # each rank restored only its own shard of the weights: gather the rest
        ddp_model.start_param_sync(force_sync=True)


def _saved_step(state: dict[str, Any]) -> float | None:
    """The Adam step the checkpoint recorded: megatron's ``DistributedOptimizer.state_dict``
    moves torch-AdamW's per-parameter ``step`` into ``optimizer.param_groups[*]['step']``."""
    groups = state.get("optimizer", {}).get("param_groups", []) if isinstance(state, dict) else []
    steps = {group["step"] for group in groups if "step" in group}
    return steps.pop() if len(steps) == 1 else None


def _allocate_torch_adam_state(optimizer) -> None:
    """Give an unstepped ``torch.optim.Adam(W)`` inside megatron's optimizer the state its first
    step would create (``step`` 0, zero moments): a template that loading overwrites, and
    exactly what a first step starts from if nothing is loaded."""
    for sub in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(sub, "optimizer", None)
        if not isinstance(inner, (torch.optim.Adam, torch.optim.AdamW)) or inner.state:
            continue
        for group in inner.param_groups:
            for param in group["params"]:
                state = {"step": torch.tensor(0.0),
                         "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                         "exp_avg_sq": torch.zeros_like(param,
                                                        memory_format=torch.preserve_format)}
                if group.get("amsgrad"):
                    state["max_exp_avg_sq"] = torch.zeros_like(param)
                inner.state[param] = state
