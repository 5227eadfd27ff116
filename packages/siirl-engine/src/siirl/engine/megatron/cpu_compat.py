"""Runtime adapters that let megatron-core 0.16 run its GPT forward/backward on CPU.

megatron-core imports and builds models without CUDA (``use_cpu_initialization=True``), and
``parallel_state.initialize_model_parallel`` runs on gloo, but a few functions on the
forward/backward path hard-code the GPU. Tests (and CPU-only development) need that path,
so :func:`enable_cpu_mode` patches exactly those spots at runtime; nothing under
site-packages is edited and nothing outside megatron-core is touched (``torch`` itself is
never monkey-patched, so other code in the same process sees the real ``torch.cuda``).
Call it before building models; then seed with megatron's own
``tensor_parallel.model_parallel_cuda_manual_seed`` (it works on the CPU tracker below).

Each adapter below says which megatron function reaches CUDA and why the replacement
computes the same thing on CPU. The patches are idempotent and are skipped entirely when
CUDA is available (the GPU path must stay megatron's own).

Megatron's ``DistributedDataParallel`` (synchronous grad sync) and its optimizers (plain and
distributed, fp32 params, torch's AdamW fallback) are covered too; gloo supports the
reduce-scatter / all-gather (coalesced) they issue. Not covered (they stay GPU-only):
activation recomputation (``tensor_parallel.checkpoint`` saves/restores CUDA RNG states),
Transformer Engine, fused kernels, CUDA graphs, the inference KV cache, and DDP with several
distributed-optimizer instances (CUDA streams). bf16 parameters with fp32 main copies (megatron's
``Float16OptimizerWithFloat16Params`` and ``DistributedOptimizer``) run here too.
"""

from __future__ import annotations

import contextlib
import importlib

import torch
from megatron.core.tensor_parallel.random import (
    _MODEL_PARALLEL_RNG_TRACKER_NAME,
    CudaRNGStatesTracker,
)

from siirl.engine.megatron.cpu_torch import CPU_TORCH, CPU_TORCH_NO_CUDA_DEVICE

__all__ = ["CpuRNGStatesTracker", "enable_cpu_mode", "cpu_mode_enabled"]

_ENABLED = False


# Modules whose functions on the CPU path allocate with ``device=torch.cuda.current_device()``
# (which raises "Torch not compiled with CUDA enabled"). Inside them ``torch`` is rebound to
# CPU_TORCH, so those allocations land on the CPU, where every input tensor already lives:
# the functions then compute exactly what they compute on a GPU, on the CPU.
_CURRENT_DEVICE_USERS = {
    # RotaryEmbedding.get_emb moves ``inv_freq`` "to the GPU once" on every forward.
    "megatron.core.models.common.embeddings.rotary_pos_embedding":
        "RotaryEmbedding.get_emb",
    # _gather_along_first_dim / _gather_along_last_dim / _reduce_scatter_along_first_dim
    # allocate their collective output buffers (TP > 1 gathers of logits, sequence parallel).
    "megatron.core.tensor_parallel.mappings": "_gather_along_*, _reduce_scatter_along_*",
    # LinearWithGradAccumulationAndAsyncCommunication.backward allocates the all-gather /
    # reduce-scatter buffers; the layers' __init__ allocates weights when
    # use_cpu_initialization is off.
    "megatron.core.tensor_parallel.layers": "linear backward buffers, weight allocation",
    # split_tensor_into_1d_equal_chunks / gather_split_1d_tensor (pipeline p2p scatter-gather).
    "megatron.core.tensor_parallel.utils": "split_tensor_into_1d_equal_chunks, gather_split_1d",
    # GlobalMemoryBuffer.get_tensor: the reused buffer behind sequence-parallel all-gathers.
    "megatron.core.utils": "GlobalMemoryBuffer.get_tensor",
    # FileSystemWriterAsync.preload_tensors waits with torch.cuda.synchronize() after its
    # (non-blocking) device-to-host copies: dist_checkpointing.save on CPU tensors.
    "megatron.core.dist_checkpointing.strategies.filesystem_async": "preload_tensors",
    # save_state_dict_async_finalize all-reduces a failure flag allocated on the current
    # device (gloo reduces it on the CPU just the same).
    "megatron.core.dist_checkpointing.strategies.state_dict_saver":
        "save_state_dict_async_finalize",
    # the async-call bookkeeping all-reduces small int tensors on the current device.
    "megatron.core.dist_checkpointing.strategies.async_utils": "is_alive / call_idx checks",
    # P2PCommunicator._communicate allocates the receive buffers (and the shape tensors for
    # variable_seq_lengths) on the current device and calls torch.cuda.synchronize() after
    # batch_isend_irecv ("race condition" guard; gloo's CPU ops complete on wait()).
    "megatron.core.pipeline_parallel.p2p_communication": "P2PCommunicator._communicate",
    # _ParamAndGradBuffer.__init__ (megatron DDP) allocates the contiguous param / grad buffers
    # that every parameter's ``.data`` / ``.main_grad`` become views of.
    "megatron.core.distributed.param_and_grad_buffer": "_ParamAndGradBuffer.__init__",
    # DistributedOptimizer.load_state_dict allocates the (not yet created) Adam state shards
    # it loads into on the current device; get_parameter_state_dp_zero its gather buffers.
    "megatron.core.optimizer.distrib_optimizer": "load_state_dict state allocation",
}

# Modules that allocate with the literal ``device="cuda"``; inside them ``torch`` is rebound to
# CPU_TORCH_NO_CUDA_DEVICE, whose tensor factories map that device to the CPU.
_CUDA_STRING_USERS = {
    # forward_backward_no_pipelining / forward_backward_pipelining_{with,without}_interleaving
    # start their token counter as ``torch.zeros([], dtype=torch.int, device="cuda")``; it is
    # only summed (and handed to finalize_model_grads_func), so the CPU holds it just as well.
    "megatron.core.pipeline_parallel.schedules": "total_num_tokens of every schedule",
    # MixedPrecisionOptimizer.__init__ (base of DistributedOptimizer) allocates its unit loss
    # scale ``_scale_one`` and the multi-tensor-apply overflow flag with device='cuda'.
    "megatron.core.optimizer.optimizer": "MixedPrecisionOptimizer.__init__ scalars",
    # get_grad_norm_fp32 / count_zeros_fp32 / clip_grad_by_total_norm_fp32 allocate their
    # accumulators (the norm, the zero count, the overflow flag) with device='cuda' and then
    # all-reduce them: gloo reduces the same values on the CPU.
    "megatron.core.optimizer.clip_grads": "grad-norm / zero-count accumulators",
    # DynamicGradScaler (float16's loss scaling) keeps its scale and factors on 'cuda'.
    "megatron.core.optimizer.grad_scaler": "DynamicGradScaler scalars",
}


class CpuRNGStatesTracker(CudaRNGStatesTracker):
    """CPU twin of megatron's ``tensor_parallel.random.CudaRNGStatesTracker``.

    Megatron's tracker keeps named *CUDA* generator states (``torch.cuda.get_rng_state``)
    and ``fork()`` swaps one in around dropout in tensor-parallel regions (e.g.
    ``DotProductAttention.forward`` forks it for attention dropout), so that TP ranks draw
    different masks there and identical ones elsewhere. On CPU the generator that dropout
    draws from is the CPU default generator, so the equivalent is to keep named CPU states
    (``torch.get_rng_state``) and swap those: same seeds, same bookkeeping, same semantics.
    Being a subclass, ``isinstance`` checks against megatron's class still hold.
    """

    def __init__(self, use_cudagraphable_rng: bool = False,
                 is_inference_rng_tracker: bool = False):
        # graph-safe generator states are a CUDA-graph feature: plain states on CPU
        super().__init__(use_cudagraphable_rng=False,
                         is_inference_rng_tracker=is_inference_rng_tracker)

    def add(self, name: str, seed: int) -> None:
        self._is_initialized = True
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        if name in self.states_:
            raise Exception(f"rng state {name} already exists")
        self.seeds_.add(seed)
        orig = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(orig)

    @contextlib.contextmanager
    def fork(self, name: str = _MODEL_PARALLEL_RNG_TRACKER_NAME):
        if name not in self.states_:
            raise Exception(f"rng state {name} is not added")
        orig = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(orig)


def _cpu_default_causal_mask(sq: int) -> torch.Tensor:
    """``transformer.utils.get_default_causal_mask`` builds the same mask with
    ``device="cuda"``; FusedScaleMaskSoftmax.forward_torch_softmax calls it when no mask
    is passed. Same values (True above the diagonal = masked out), on the CPU."""
    return torch.triu(torch.ones(sq, sq), diagonal=1).bool()


def _cpu_sliding_window_causal_mask(sq: int, skv: int, window_size) -> torch.Tensor:
    """CPU copy of ``transformer.utils.get_sliding_window_causal_mask`` (``device="cuda"``)."""
    m = torch.ones(sq, skv, dtype=torch.bool)
    mu = torch.triu(m, diagonal=skv - sq - window_size[0])
    return ~torch.tril(mu, diagonal=skv - sq + window_size[1])


def _false() -> bool:
    return False


def _patch_tied_embedding_setup() -> None:
    """``LanguageModule.setup_embeddings_and_output_layer`` (tied embeddings, PP > 1) moves
    the shared embedding copy to the GPU (``weight.data = weight.data.cuda()``) and then
    all-reduces it between the first and last stage, so both start equal. The wrapper runs
    the original with the all-reduce branch switched off (``_is_in_embd_group`` answers
    False for that call) and then performs the same all-reduce on the CPU tensor."""
    import torch.distributed as dist

    module = importlib.import_module("megatron.core.models.common.language_module."
                                     "language_module")
    original = module.LanguageModule.setup_embeddings_and_output_layer
    if getattr(original, "_siirl_cpu", False):
        return

    def setup_embeddings_and_output_layer(self) -> None:
        in_group = dist.is_initialized() and self._is_in_embd_group()
        self._is_in_embd_group = _false  # instance attribute shadows the method
        try:
            original(self)
        finally:
            del self.__dict__["_is_in_embd_group"]
        shares = self.share_embeddings_and_output_weights or getattr(
            self.config, "mtp_num_layers", 0)
        if in_group and shares and self.config.pipeline_model_parallel_size > 1:
            dist.all_reduce(self.shared_embedding_or_output_weight().data,
                            group=self.embd_group)

    setup_embeddings_and_output_layer._siirl_cpu = True
    module.LanguageModule.setup_embeddings_and_output_layer = setup_embeddings_and_output_layer


def _cpu_multi_tensor_l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """CPU copy of ``megatron.core.utils.local_multi_tensor_l2_norm`` (the fallback that
    ``optimizer.clip_grads.get_grad_norm_fp32`` uses when neither TE nor apex is installed),
    which returns its result as ``torch.tensor(..., device="cuda")``: the same L2 norm of
    the per-tensor L2 norms, as a float32 ``[1]`` tensor on the CPU."""
    norms = [[torch.norm(tensor) for tensor in tensor_list] for tensor_list in tensor_lists]
    total = torch.norm(torch.tensor(norms))
    return torch.tensor([float(total)], dtype=torch.float), None


def _cpu_clip_grad_by_total_norm_fp32(parameters, max_norm, total_norm,
                                      use_decoupled_grad: bool = False) -> None:
    """CPU copy of ``optimizer.clip_grads.clip_grad_by_total_norm_fp32``, which asserts
    ``param.grad.type() == 'torch.cuda.FloatTensor'`` (a CPU fp32 grad is 'torch.FloatTensor')
    and scales through a multi-tensor kernel. Same check on the dtype, same in-place scaling
    ``grad = grad * clip_coeff`` (what megatron's ``local_multi_tensor_scale`` does), same
    coefficient ``max_norm / (total_norm + 1e-6)`` applied only when it is below 1."""
    from megatron.core.utils import to_local_if_dtensor

    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    grads = []
    for param in parameters:
        grad = getattr(param, "decoupled_grad" if use_decoupled_grad else "grad", None)
        if grad is not None:
            allowed = (torch.float32, torch.bfloat16) if use_decoupled_grad else (torch.float32,)
            assert grad.dtype in allowed, grad.dtype
            grads.append(to_local_if_dtensor(grad).detach())
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0:
        for grad in grads:
            grad.copy_(grad * clip_coeff)


def _patch_clip_grads() -> None:
    """``optimizer.clip_grads`` (grad-norm clipping of every megatron optimizer's step):

    * its multi-tensor L2 norm becomes :func:`_cpu_multi_tensor_l2_norm` (TE's and apex's are
      CUDA kernels, megatron's fallback returns a CUDA tensor) behind megatron's own
      pure-python ``local_multi_tensor_applier``;
    * ``clip_grad_by_total_norm_fp32`` becomes :func:`_cpu_clip_grad_by_total_norm_fp32`, in
      ``clip_grads`` and in ``optimizer.optimizer``, which imported it by name."""
    from megatron.core.utils import local_multi_tensor_applier

    clip_grads = importlib.import_module("megatron.core.optimizer.clip_grads")
    clip_grads.multi_tensor_applier = local_multi_tensor_applier
    clip_grads.l2_norm_impl = _cpu_multi_tensor_l2_norm
    clip_grads.clip_grad_by_total_norm_fp32 = _cpu_clip_grad_by_total_norm_fp32
    optimizer = importlib.import_module("megatron.core.optimizer.optimizer")
    optimizer.clip_grad_by_total_norm_fp32 = _cpu_clip_grad_by_total_norm_fp32


# the CUDA type names megatron's optimizers sort parameters by (param.type())
_CUDA_TYPE_NAMES = {torch.float32: "torch.cuda.FloatTensor",
                    torch.bfloat16: "torch.cuda.BFloat16Tensor",
                    torch.float16: "torch.cuda.HalfTensor"}


def _cuda_type_query(name: str):
    def type_(*args, **kwargs) -> str:
        if args or kwargs:  # a conversion, not the type query: nothing there does this
            raise NotImplementedError("cpu_compat: Tensor.type(dtype) is not adapted here")
        return name
    return type_


def _patch_grad_scaler_load() -> None:
    """DynamicGradScaler.load_state_dict moves the saved scale to the current CUDA device;
    on the CPU it stays where it is."""
    scaler = importlib.import_module("megatron.core.optimizer.grad_scaler").DynamicGradScaler

    def load_state_dict(self, state_dict):
        self._scale = state_dict["scale"].cpu()
        self._growth_tracker = state_dict["growth_tracker"]
        self._hysteresis_tracker = state_dict["hysteresis_tracker"]

    scaler.load_state_dict = load_state_dict


def _patch_optimizer_param_types() -> None:
    """megatron's mixed-precision optimizers sort parameters by ``param.type()`` in their
    ``__init__`` (``Float16OptimizerWithFloat16Params``; ``DistributedOptimizer`` and its
    ``_build_model_and_main_param_groups``): 'torch.cuda.HalfTensor' / 'BFloat16Tensor' get
    an fp32 main copy, 'torch.cuda.FloatTensor' is optimised in place, anything else raises
    TypeError -- so every CPU parameter ('torch.FloatTensor', 'torch.BFloat16Tensor') is
    refused. The wrapper runs the original ``__init__`` with each CPU parameter of the
    torch optimizer answering ``type()`` with the CUDA name of its own dtype (an instance
    attribute that shadows the method for that call only): the same branches, hence the
    same fp32 main copies and shard views, a GPU run builds."""
    optimizer = importlib.import_module("megatron.core.optimizer.optimizer")
    distrib = importlib.import_module("megatron.core.optimizer.distrib_optimizer")
    for cls in (optimizer.Float16OptimizerWithFloat16Params, distrib.DistributedOptimizer):
        original = cls.__dict__["__init__"]
        if getattr(original, "_siirl_cpu", False):
            continue

        def __init__(self, torch_optimizer, *args, _original=original, **kwargs):
            params = [param for group in getattr(torch_optimizer, "param_groups", ())
                      for param in group["params"]
                      if param.device.type == "cpu" and param.dtype in _CUDA_TYPE_NAMES]
            for param in params:
                param.type = _cuda_type_query(_CUDA_TYPE_NAMES[param.dtype])
            try:
                _original(self, torch_optimizer, *args, **kwargs)
            finally:
                for param in params:
                    param.__dict__.pop("type", None)

        __init__._siirl_cpu = True
        cls.__init__ = __init__


def _install_rng_tracker() -> None:
    random = importlib.import_module("megatron.core.tensor_parallel.random")
    # initialize_rng_tracker() instantiates the module-global name ``CudaRNGStatesTracker``;
    # rebinding it makes every (re)initialisation, including the one inside
    # model_parallel_cuda_manual_seed(), build a CPU tracker. That seed function otherwise
    # only calls torch.cuda.manual_seed, which CPU builds queue lazily without error.
    random.CudaRNGStatesTracker = CpuRNGStatesTracker  # (the original stays our base class)
    if not isinstance(random._CUDA_RNG_STATE_TRACKER, CpuRNGStatesTracker):
        random._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
        random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    # activation recompute (tensor_parallel.checkpoint) saves and restores the CPU
    # generator, the tracker's states and the CUDA generator's: on the CPU there is none
    random._get_cuda_rng_state = lambda *args, **kwargs: torch.empty(0, dtype=torch.uint8)
    random._set_cuda_rng_state = lambda *args, **kwargs: None


def cpu_mode_enabled() -> bool:
    return _ENABLED


def enable_cpu_mode(force: bool = False) -> bool:
    """Apply the CPU adapters (idempotent). Returns whether they are active.

    Skipped when CUDA is available unless ``force``: on a GPU machine megatron's own code
    path is the one to use.
    """
    global _ENABLED
    if _ENABLED:
        return True
    if torch.cuda.is_available() and not force:
        return False
    for module_name in _CURRENT_DEVICE_USERS:
        importlib.import_module(module_name).torch = CPU_TORCH
    for module_name in _CUDA_STRING_USERS:
        importlib.import_module(module_name).torch = CPU_TORCH_NO_CUDA_DEVICE
    softmax = importlib.import_module("megatron.core.fusions.fused_softmax")
    softmax.get_default_causal_mask = _cpu_default_causal_mask
    softmax.get_sliding_window_causal_mask = _cpu_sliding_window_causal_mask
    _install_rng_tracker()
    _patch_tied_embedding_setup()
    _patch_clip_grads()
    _patch_optimizer_param_types()
    _patch_grad_scaler_load()
    from siirl.engine.megatron.cpu_compat_moe import enable_moe_cpu_mode

    enable_moe_cpu_mode()  # the MoE layer's (siirl.engine.megatron.cpu_compat_moe)
    _ENABLED = True
    return True
