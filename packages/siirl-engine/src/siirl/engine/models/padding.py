"""Drop the padding columns that no row of a micro-batch uses before a forward.

Batches keep a fixed width (prompts left-padded to ``data.max_prompt_length``, responses
right-padded to ``data.max_response_length``), but most micro-batches use far less: short
answers stop at EOS, short prompts leave pad columns on the left. A column that is padding
in every row changes nothing for the other columns (it is masked out of attention and
positions are explicit), so the forward runs on the used columns only and the per-token
outputs are padded back to the response width. Padded response positions hold 0 (by
contract they are meaningless and masked by ``response_mask``).
"""

from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Optional

import torch
import torch.nn.functional as F

__all__ = ["UsedColumns", "used_columns", "on_used_columns"]


class UsedColumns(NamedTuple):
    start: int  # first kept column
    stop: int  # one past the last kept column
    response_length: int  # response columns kept (the first ones)


def used_columns(attention_mask: torch.Tensor, response_length: int) -> UsedColumns:
    """The column range of ``attention_mask`` ``[B, P+R]`` to run a forward on.

    Keeps every column from the first one any row attends to up to the last one, but never
    trims into the prompt on the right (the logits at column P-1 predict response token 0)
    nor into the response on the left, and keeps one response column even when every
    response is empty (the loss still needs a graph to backpropagate through).
    """
    width = attention_mask.shape[-1]
    prompt = width - int(response_length)
    used = attention_mask.reshape(-1, width).ne(0).any(dim=0)
    nonzero = used.nonzero()
    if nonzero.numel() == 0:
        return UsedColumns(0, width, int(response_length))
    first, last = int(nonzero[0]), int(nonzero[-1])
    start = min(first, max(prompt - 1, 0))
    stop = max(last + 1, prompt + min(1, int(response_length)))
    return UsedColumns(start, stop, stop - prompt)


def _to_response_width(value: Optional[torch.Tensor], keep: torch.Tensor
                       ) -> Optional[torch.Tensor]:
    if value is None:
        return None
    if value.shape[-1] != keep.shape[-1]:
        value = F.pad(value, (0, keep.shape[-1] - value.shape[-1]))
    return torch.where(keep, value, torch.zeros((), dtype=value.dtype, device=value.device))


def on_used_columns(fn: Callable[..., Dict[str, Optional[torch.Tensor]]],
                    module: torch.nn.Module, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor, position_ids: torch.Tensor,
                    response_length: int, **kwargs) -> Dict[str, Optional[torch.Tensor]]:
    """``fn(module, input_ids, attention_mask, position_ids, response_length, **kwargs)``
    (per-token outputs ``[B, R']``) run on the used columns only, outputs widened back to
    ``[B, response_length]``.

    Outputs are 0 at every padded response position, trimmed or not, so two passes that
    trim differently (other micro-batches) still agree there: a log-ratio of padding is 0.
    """
    resp = int(response_length)
    keep = attention_mask[:, attention_mask.shape[-1] - resp:].ne(0)
    cols = used_columns(attention_mask, resp)
    part = slice(cols.start, cols.stop)
    if cols.start == 0 and cols.stop == attention_mask.shape[-1]:
        outputs = fn(module, input_ids, attention_mask, position_ids, resp, **kwargs)
    else:
        outputs = fn(module, input_ids[:, part], attention_mask[:, part],
                     position_ids[..., part], cols.response_length, **kwargs)
    return {name: _to_response_width(value, keep) for name, value in outputs.items()}
