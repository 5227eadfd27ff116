"""Megatron's uneven tensor-parallel collectives over gloo (the CPU adapter in
``siirl.engine.megatron.cpu_compat_moe``): MoE with TP > 1 all-gathers each TP rank's routed
tokens (``output_split_sizes``) and reduce-scatters them back (``input_split_sizes``), with
different row counts per rank, which gloo's own ``all_gather`` refuses. Two gloo ranks with
3 and 5 rows get exactly the concatenation and the per-rank sums."""

import pytest
import torch
import torch.multiprocessing as mp

from siirl_spawn import finish_rank, join_spawned, start_gloo_rank

pytest.importorskip("megatron.core")

from test_megatron_bridge import free_port  # noqa: E402

SIZES = [3, 5]


def _rows(rank: int, count: int) -> torch.Tensor:
    return torch.arange(count * 4, dtype=torch.float32).reshape(count, 4) + 100 * rank


def rank_main(rank: int, port: int) -> None:

    import torch.distributed as dist
    from megatron.core.tensor_parallel import mappings

    from siirl.engine.megatron.cpu_compat import enable_cpu_mode

    start_gloo_rank(rank, 2, port)
    enable_cpu_mode()
    group = dist.group.WORLD
    gathered = mappings._gather_along_first_dim(_rows(rank, SIZES[rank]), group,
                                                output_split_sizes=SIZES)
    assert torch.equal(gathered, torch.cat([_rows(r, SIZES[r]) for r in range(2)]))
    whole = sum(SIZES)
    scattered = mappings._reduce_scatter_along_first_dim(_rows(rank, whole), group,
                                                         input_split_sizes=SIZES)
    start = sum(SIZES[:rank])
    want = (_rows(0, whole) + _rows(1, whole))[start:start + SIZES[rank]]
    assert torch.equal(scattered, want)
    even = mappings._gather_along_first_dim(_rows(rank, 2), group, output_split_sizes=[2, 2])
    assert torch.equal(even, torch.cat([_rows(0, 2), _rows(1, 2)]))
    finish_rank()


def test_uneven_gather_and_reduce_scatter_over_gloo():
    context = mp.start_processes(rank_main, args=(free_port(),), nprocs=2, join=False,
                                 start_method="spawn")
    join_spawned(context, "the 2-rank uneven gloo collectives")
