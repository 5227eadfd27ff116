"""Partial rollouts for the ``hf`` rollout: generation that pauses when new weights arrive,
loads them and goes on with the unfinished responses under them (verl's
``async_training.partial_rollout``).

The opt-in hook (``HFRollout.set_pause_hook(hook)``, None clears it) is any object with

- ``pending() -> bool``: new weights are waiting (asked between decode steps, so cheap);
- ``swap() -> int``: load them into the engine (through its ``load_weights``) and return
  the version now loaded;
- ``version() -> int``: the version loaded now.

With a hook, a training ``generate`` decodes as usual but asks ``pending`` after each
token; on True the decoding loop stops, the sharded-weights context (``full_weights``) is
left, ``swap`` runs, and the rows that had neither emitted EOS nor used their token budget
continue: their prompt + tokens so far is prefilled again under the new weights (appended
to the left-padded prompt, so it stays left-padded) with the budget that is left, and so
on until every row is done. Rows of a chunk (``rollout.max_num_seqs``) not yet started
when the pause came start under the new weights. The pieces are stitched into the
response fields exactly where an uninterrupted call puts them, ``rollout_log_probs``
included (each token's log-prob under the weights that sampled it).

A continued row keeps its own noise key and draws from it at its token offset, so a rerun
with the same pause points gives the same tokens (and, with the same weights, the tokens
of no pause at all up to the rounding of the second prefill).

Each response token records the version that sampled it (``TOKEN_POLICY_VERSION``, -1 on
padding) and each row its oldest token's version (``POLICY_VERSION``). Validation (greedy)
never pauses, and without a hook ``generate`` runs exactly as before.
"""

from __future__ import annotations

from typing import Callable, ContextManager, Protocol

import torch

from siirl.engine.rollout.decoded import Decoded

__all__ = ["PauseHook", "check_pause_hook", "continuation_inputs", "decode_with_pauses",
           "policy_versions"]


class PauseHook(Protocol):
    """What ``HFRollout.set_pause_hook`` takes (see the module docstring)."""

    def pending(self) -> bool: ...

    def swap(self) -> int: ...

    def version(self) -> int: ...


def check_pause_hook(hook: PauseHook | None, owner: str) -> None:
    """Refuse a hook without the three methods (None, which clears it, passes)."""
    for name in ("pending", "swap", "version"):
        if hook is not None and not callable(getattr(hook, name, None)):
            raise TypeError(f"{owner}.set_pause_hook: the hook {hook!r} has no method "
                            f"{name}(); it needs pending() -> bool (new weights wait), "
                            "swap() -> int (load them, return their version) and "
                            "version() -> int (the version loaded now)")


def continuation_inputs(prompts: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                        prefix: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompts with the ``prefix`` tokens [r, L] already generated appended:
    the prompt of a continued row (positions go on from the prompt's last)."""
    steps = torch.arange(1, prefix.shape[1] + 1, device=positions.device,
                         dtype=positions.dtype)
    return (torch.cat([prompts, prefix.to(prompts)], dim=1),
            torch.cat([mask, mask.new_ones(prefix.shape)], dim=1),
            torch.cat([positions, positions[:, -1:] + steps], dim=1))


def decode_with_pauses(hook: PauseHook, weights: Callable[[], ContextManager],
                       run: Callable[[torch.Tensor, torch.Tensor, Callable[[], bool]], Decoded],
                       rows: int, width: int, chunk: int, pad_id: int, with_log_probs: bool
                       ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``(tokens [rows, width], log_probs or None, versions [rows, width])`` on the CPU.

    ``run(row_index, prefix, pause)`` decodes the rows ``row_index`` (long [r]) of the call
    after their ``prefix`` tokens [r, L] (L new tokens at most ``width - L``) and returns
    ``sampler.decode``'s ``Decoded``; ``weights()`` is the context the forwards need
    (``full_weights``), left for each ``hook.swap()``. Columns no token reached hold
    ``pad_id`` (log-prob 0, version -1)."""
    tokens = torch.full((rows, width), pad_id, dtype=torch.long)
    log_probs = torch.zeros((rows, width), dtype=torch.float32) if with_log_probs else None
    versions = torch.full((rows, width), -1, dtype=torch.long)
    # (rows of the call, tokens they already have): every row of a job has as many
    queue = [(torch.arange(start, min(start + chunk, rows)), 0)
             for start in range(0, rows, chunk)]
    while queue:
        paused = False
        with weights():
            while queue and not paused:
                index, done = queue.pop(0)
                version = int(hook.version())
                got = run(index, tokens[index, :done], hook.pending)
                columns = slice(done, done + got.tokens.shape[1])
                tokens[index, columns] = got.tokens.cpu()
                versions[index, columns] = version
                if log_probs is not None:
                    log_probs[index, columns] = got.log_probs.cpu()
                unfinished = got.unfinished.cpu()
                if bool(unfinished.any()):
                    queue.insert(0, (index[unfinished], columns.stop))
                    paused = True
        if paused:  # outside the sharded-weights context: the swap writes the full weights
            hook.swap()
    return tokens, log_probs, versions


def policy_versions(versions: torch.Tensor, response_mask: torch.Tensor, fallback: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(per-token versions [B, R], -1 on padding; per-row oldest version [B])``; a row
    without response tokens gets ``fallback``."""
    valid = response_mask.bool()
    per_token = torch.where(valid, versions, torch.full_like(versions, -1))
    big = torch.iinfo(versions.dtype).max
    oldest = torch.where(valid, versions, torch.full_like(versions, big)).amin(dim=1) \
        if versions.shape[1] else torch.full((versions.shape[0],), big, dtype=versions.dtype)
    return per_token, torch.where(oldest == big, torch.full_like(oldest, fallback), oldest)
