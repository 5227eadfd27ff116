"""The CPU adapters of megatron-core 0.16's MoE layer (router, experts, token dispatchers),
applied by :func:`siirl.engine.megatron.cpu_compat.enable_cpu_mode` like the dense ones there:
``torch`` is rebound inside the listed megatron modules only; megatron's files are not edited.

* ``moe.router`` (``Router.gating`` moves the router weight "to the GPU" on every forward;
  the aux-loss helpers allocate their scalars on the current device), ``moe.experts`` (expert
  weights allocated on the current device without ``use_cpu_initialization``): the current
  device names the CPU, where every tensor of the run already lives.
* ``moe.moe_utils`` starts the aux-loss logging tracker with ``device="cuda"``: on the CPU.
* ``moe.token_dispatcher``: the alltoall dispatcher copies its split sizes to the host on a
  side CUDA stream and waits for that stream's event before the all-to-all. On the CPU the
  tensors are already on the host and every copy is synchronous, so the stream, its context
  and its event are no-ops (:class:`_HostStream`); the copies and the collectives (gloo's
  ``all_to_all_single`` with uneven splits, ``all_gather``, ``reduce_scatter``) are megatron's.
  Its ``maybe_move_tensor_to_cpu`` hands the split sizes to the all-to-all as numpy arrays
  after the device-to-host copy, but copies (and converts) CUDA tensors only: a CPU tensor
  of split sizes, which ``all_to_all_single`` refuses, stays a tensor.
  :func:`_host_splits` converts host tensors the same way.
* ``tensor_parallel.mappings`` (MoE with TP > 1: the alltoall dispatcher all-gathers the
  tokens of the TP ranks, ``output_split_sizes``, and reduce-scatters them back,
  ``input_split_sizes``, both uneven): gloo refuses an ``all_gather`` into tensors of
  different sizes, so :class:`_UnevenGlooDistributed` gathers rows padded to the largest
  split and keeps each rank's own rows, and reduce-scatters unevenly as an all-reduce of
  the whole input keeping this rank's rows (the same sums).
"""

from __future__ import annotations

import contextlib
import importlib

import torch

from siirl.engine.megatron.cpu_torch import CPU_TORCH, CPU_TORCH_NO_CUDA_DEVICE, CpuCuda


class _HostStream:
    """A CUDA stream where there is none: work issued "on" it is already done."""

    def wait_stream(self, stream) -> None:
        return None

    def record_event(self, event=None) -> _HostStream:
        return self

    def synchronize(self) -> None:
        return None

    def wait_event(self, event) -> None:
        return None


_HOST_STREAM = _HostStream()


class _StreamlessCuda(CpuCuda):
    """CpuCuda whose streams are the single host stream (see module doc)."""

    @staticmethod
    def Stream(*args, **kwargs) -> _HostStream:  # noqa: N802 (torch.cuda.Stream's name)
        return _HOST_STREAM

    @staticmethod
    def current_stream(device=None) -> _HostStream:
        return _HOST_STREAM

    @staticmethod
    def stream(stream) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class _StreamlessTorch:
    """``torch`` inside the token dispatcher: the real one but for ``torch.cuda``."""

    cuda = _StreamlessCuda()

    def __getattr__(self, name):
        return getattr(torch, name)


class _UnevenGlooDistributed:
    """``torch.distributed`` inside megatron's mappings: gloo's collectives, with uneven
    ``all_gather`` / ``reduce_scatter`` splits done as even ones (see module doc)."""

    def __getattr__(self, name):
        return getattr(torch.distributed, name)

    @staticmethod
    def all_gather(tensor_list, tensor, group=None, async_op=False):
        sizes = [t.shape[0] for t in tensor_list]
        if len(set(sizes)) == 1:
            return torch.distributed.all_gather(tensor_list, tensor, group=group,
                                                async_op=async_op)
        rows = max(sizes)
        padded = tensor.new_zeros((rows, *tensor.shape[1:]))
        padded[:tensor.shape[0]] = tensor
        gathered = [torch.empty_like(padded) for _ in tensor_list]
        torch.distributed.all_gather(gathered, padded, group=group)
        for out, got, size in zip(tensor_list, gathered, sizes, strict=True):
            out.copy_(got[:size])
        return None

    @staticmethod
    def reduce_scatter(output, input_list, op=torch.distributed.ReduceOp.SUM, group=None,
                       async_op=False):
        sizes = [t.shape[0] for t in input_list]
        whole = torch.cat(input_list).contiguous()
        torch.distributed.all_reduce(whole, op=op, group=group)
        start = sum(sizes[:torch.distributed.get_rank(group)])
        output.copy_(whole[start:start + output.shape[0]])
        return None


class _UnevenGlooTorch:
    """``torch`` inside megatron's mappings: CPU_TORCH, with :class:`_UnevenGlooDistributed`."""

    distributed = _UnevenGlooDistributed()

    def __getattr__(self, name):
        return getattr(CPU_TORCH, name)


def _host_splits(tensor, as_numpy: bool = False, record_stream: bool = False):
    """``moe_utils.maybe_move_tensor_to_cpu`` for tensors already on the host: the same
    values, as numpy where megatron asks for numpy (``record_stream``: no stream here)."""
    if torch.is_tensor(tensor) and as_numpy:
        return tensor.numpy()
    return tensor


# megatron module -> the torch stand-in it sees (why: module doc)
_MOE_MODULES = {
    "megatron.core.transformer.moe.router": CPU_TORCH,
    "megatron.core.transformer.moe.experts": CPU_TORCH,
    "megatron.core.transformer.moe.moe_utils": CPU_TORCH_NO_CUDA_DEVICE,
    "megatron.core.transformer.moe.token_dispatcher": _StreamlessTorch(),
    "megatron.core.tensor_parallel.mappings": _UnevenGlooTorch(),
}


def enable_moe_cpu_mode() -> None:
    for module_name, stand_in in _MOE_MODULES.items():
        importlib.import_module(module_name).torch = stand_in
    importlib.import_module("megatron.core.transformer.moe.token_dispatcher"
                            ).maybe_move_tensor_to_cpu = _host_splits
