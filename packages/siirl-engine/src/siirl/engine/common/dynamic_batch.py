"""verl's dynamic batch size: micro-batches cut by token count instead of row count.

With ``use_dynamic_bsz`` a mini-batch (or a log-prob pass) is split into
``ceil(tokens / max_tokens)`` micro-batches, where ``tokens`` counts the real tokens of its
rows (attention mask) and ``max_tokens`` is the role's ``*_max_token_len_per_gpu``; rows go
to micro-batches by the Karmarkar-Karp partition the DataBuffer balances with, so their
token sums are close. Every data-parallel rank then runs the largest count any of them
needs (sharded models gather parameters in lockstep). The losses weigh each micro-batch by
its share of the mini-batch's tokens (or sequences), so the gradient is the one of fixed
micro-batching up to float rounding.
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Union

import torch

from siirl.data_coordinator.balance import karmarkar_karp
from siirl.data_coordinator.fields import ATTENTION_MASK
from siirl.engine.common.update_settings import TokenBudget
from siirl.errors import ConfigError

Plan = List[List[int]]  # row indices per micro-batch
Micro = Union[int, Plan]  # rows per micro-batch, or an explicit plan


def check_backend(backend: Any, *budgets: Optional[TokenBudget]) -> None:
    """A backend that cannot run token plans (micro-batches of different rows; the fsdp
    and megatron backends can) refuses dynamic batch size at start."""
    used = [b.key for b in budgets if b is not None]
    if used and not getattr(backend, "token_plans", False):
        raise ConfigError(f"dynamic batch size ({', '.join(used)}, use_dynamic_bsz=true) is "
                          f"not supported by the {type(backend).__name__} (it runs micro-"
                          "batches of equal rows only); set use_dynamic_bsz=false or use the "
                          "fsdp or megatron strategy")


def token_plan(data: Any, limit: TokenBudget, dp_group: Any = None, dp_size: int = 1) -> Plan:
    """Row indices of each micro-batch of ``data`` under ``limit``."""
    lengths = data[ATTENTION_MASK].sum(-1).tolist()
    rows = len(lengths)
    if rows == 0:
        return [[]]
    longest = max(lengths)
    if longest > limit.max_tokens:
        raise ConfigError(f"{limit.key}={limit.max_tokens} is below the longest sequence of "
                          f"this batch ({int(longest)} tokens); raise it to at least "
                          "data.max_prompt_length + data.max_response_length")
    count = math.ceil(sum(lengths) / limit.max_tokens)
    if dp_size > 1 and torch.distributed.is_initialized():
        # NCCL reduces device tensors only; gloo, CPU ones
        nccl = torch.distributed.get_backend(dp_group) == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu"
        wanted = torch.tensor([count], dtype=torch.long, device=device)
        torch.distributed.all_reduce(wanted, op=torch.distributed.ReduceOp.MAX, group=dp_group)
        count = int(wanted.item())
    count = max(1, min(count, rows))
    parts = karmarkar_karp(lengths, count, equal_size=False)
    return [sorted(part) for part in parts if part]


def micro_batches(data: Any, micro: Micro) -> tuple[list, Optional[torch.Tensor]]:
    """The micro-batches of ``data``, and for an explicit plan the permutation that puts
    outputs concatenated in plan order back into row order (None: already in order)."""
    from siirl.data_coordinator.protocol import split

    if isinstance(micro, int):
        return split(data, micro), None
    order = torch.tensor([row for part in micro for row in part], dtype=torch.long)
    return [data[torch.tensor(part, dtype=torch.long)] for part in micro], torch.argsort(order)


def count(rows: int, micro: Micro) -> int:
    """How many micro-batches ``micro`` makes of ``rows`` rows."""
    return len(micro) if not isinstance(micro, int) else max(1, math.ceil(rows / micro))
