"""siiRL's worker order under megatron's pipeline-last layout.

siiRL numbers its workers TP fastest, then CP, then PP, then DP (``tp-cp-pp-dp``), so the
workers of one pipeline, which read the same rows, are consecutive: the planner's megatron
layout and the DataBuffer group consecutive workers. megatron-core 0.16 builds its expert
groups consistently with the dense ones only in its own pipeline-last order
(``tp-cp-ep-dp-pp``): in any other order it refuses experts split across data-parallel
ranks of a pipelined model (expert parallelism, or an expert tensor parallelism other
than TP, with PP > 1).

So megatron lays its groups out in its pipeline-last order over *its* rank numbers, and
every rank list it builds is translated to siiRL's worker numbers: megatron rank
``t + TP*(c + CP*(d + DP*p))`` is worker ``t + TP*(c + CP*(p + PP*d))``. Each group's
meaning is kept (megatron computes every rank's place from group membership), the dense
groups are the ones ``tp-cp-pp-dp`` gives, and at PP = 1 the translation is the identity.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, List, Optional

MEGATRON_ORDER = "tp-cp-ep-dp-pp"


def worker_of(megatron_rank: int, tp: int, cp: int, pp: int, world: int) -> int:
    """The siiRL worker that plays megatron rank ``megatron_rank``."""
    dp = world // (tp * cp * pp)
    t, rest = megatron_rank % tp, megatron_rank // tp
    c, rest = rest % cp, rest // cp
    d, p = rest % dp, rest // dp
    return t + tp * (c + cp * (p + pp * d))


@contextmanager
def siirl_worker_order(tp: int, cp: int, pp: int, world: int) -> Iterator[None]:
    """Within: megatron's rank generators hand out siiRL worker numbers (for
    ``initialize_model_parallel(..., order=MEGATRON_ORDER)``)."""
    from megatron.core import parallel_state

    generator = parallel_state.RankGenerator
    original = generator.get_ranks

    def get_ranks(self, token: str) -> List[List[int]]:
        return [[worker_of(rank, tp, cp, pp, world) for rank in group]
                for group in original(self, token)]

    generator.get_ranks = get_ranks
    try:
        yield
    finally:
        generator.get_ranks = original


def initialize_parallel_state(tp: int, pp: int, *, vpp: Optional[int] = None, ep: int = 1,
                              etp: Optional[int] = None) -> None:
    """megatron's ``initialize_model_parallel`` for these sizes over the world's workers in
    siiRL's order (no context parallelism: it needs Transformer Engine's attention)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    with siirl_worker_order(tp, 1, pp, dist.get_world_size()):
        parallel_state.initialize_model_parallel(
            tp, pp, virtual_pipeline_model_parallel_size=vpp, expert_model_parallel_size=ep,
            expert_tensor_parallel_size=etp, order=MEGATRON_ORDER)
