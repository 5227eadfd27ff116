"""What every rollout engine shares: reading the sampling settings, repeating each prompt
for its ``n`` samples with a group id, per-row noise keys, turning generated tokens into the
batch's response fields, and the rollout metrics.

An engine subclasses ``RolloutBase`` and implements ``generate(batch, validate)`` with
``repeat_prompts`` -> its own token generation -> ``finish``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import torch

from siirl.data_coordinator import protocol
from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    INPUT_IDS,
    POSITION_IDS,
    PROMPTS,
    RESPONSE_MASK,
    RESPONSES,
    SAMPLE_ID,
    UID,
)
from siirl.engine.common.config import typed_config
from siirl.engine.rollout.keyed_random import row_keys


def as_int(value: Any) -> int | None:
    # A dict/dataclass config may still hold an unresolved "${...}" string.
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def postprocess_responses(tokens: torch.Tensor, width: int, eos_ids: list[int],
                          pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(responses [B, width], response_mask [B, width] float32)``: the mask is 1 up to
    and including the first EOS; everything after it, and the right padding, is pad."""
    rows, got = tokens.shape
    if got < width:
        tokens = torch.cat([tokens, tokens.new_full((rows, width - got), pad_id)], dim=1)
    tokens = tokens[:, :width]
    is_eos = torch.isin(tokens, torch.tensor(eos_ids, dtype=tokens.dtype, device=tokens.device))
    eos_before = is_eos.long().cumsum(dim=1) - is_eos.long()  # EOS strictly before column
    valid = eos_before == 0
    valid[:, got:] = False
    responses = torch.where(valid, tokens, torch.full_like(tokens, pad_id))
    return responses, valid.to(torch.float32)


def eos_and_pad(module: Any, tokenizer: Any) -> tuple[list[int], int]:
    """EOS ids (the tokenizer's and the generation config's, e.g. Qwen's two) and pad."""
    eos: list[int] = []
    gen = getattr(module, "generation_config", None)
    for value in (getattr(tokenizer, "eos_token_id", None),
                  getattr(gen, "eos_token_id", None)):
        for tok in value if isinstance(value, (list, tuple)) else [value]:
            if tok is not None and int(tok) not in eos:
                eos.append(int(tok))
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if pad is not None else (eos[0] if eos else 0)
    return eos, int(pad)


class RolloutBase:
    """Config, peers and the shared steps of a rollout engine."""

    def __init__(self, role: str = "rollout", config: Any = None, worker: Any = None,
                 peers: Mapping[str, Any] | None = None):
        self.role = role
        self.config = config
        self.cfg = typed_config(config)  # read once; defaults are the schema's
        self.worker = worker
        # the actor engine (wired by the worker): its model, tokenizer and weights
        self.actor = (peers or {}).get("actor")
        self._calls = (-1, 0)  # (training step, generate calls within it): a noise salt
        self._overrides: dict = {}

    @contextmanager
    def overridden(self, n: int | None = None, response_length: int | None = None,
                   greedy: bool | None = None, val_sampled: bool | None = None
                   ) -> Iterator[None]:
        """``generate`` with ``n`` samples per prompt, ``response_length`` new tokens at
        most and, with ``greedy``, greedy decoding, instead of the config's, inside the
        block (a multi-turn env manager asks for one reply per episode and turn; ReMax's
        baseline for one greedy reply per prompt). ``val_sampled``: validation samples
        (True) or decodes greedily (False) whatever ``val_kwargs`` says (the validator's
        second decoding, ``trainer.val_greedy_and_sampled``)."""
        previous = self._overrides
        # nested blocks add to the outer one (a multi-turn turn inside a greedy baseline)
        self._overrides = {**previous, **{k: v for k, v in (
            ("n", n), ("response_length", response_length), ("greedy", greedy),
            ("val_sampled", val_sampled)) if v is not None}}
        try:
            yield
        finally:
            self._overrides = previous

    def sampling(self, validate: bool) -> dict:
        """n, greedy, temperature, top_k, top_p for training or validation."""
        rollout = self.cfg.actor_rollout_ref.rollout
        base = rollout.val_kwargs if validate else rollout
        n = as_int(base.n)
        greedy = not base.do_sample or float(base.temperature or 0.0) <= 0.0
        sampled = self._overrides.get("val_sampled") if validate else None
        if sampled is not None:
            if sampled and greedy:  # val_kwargs decode greedily: sample as training does
                base = rollout
            greedy = not sampled
        temperature = float(base.temperature or 0.0)
        top_k = as_int(base.top_k) or -1
        return {
            "n": self._overrides.get("n") or n or 1,
            "greedy": self._overrides.get("greedy", False) or greedy,
            "temperature": temperature if temperature > 0 else 1.0,
            "top_k": top_k if top_k > 0 else -1,  # -1 and 0 both mean "off"
            "top_p": float(base.top_p),
        }

    def max_response_length(self) -> int:
        length = self._overrides.get("response_length") or \
            as_int(self.cfg.data.max_response_length)
        if length is None:
            raise ValueError("set data.max_response_length")
        return length

    @staticmethod
    def token_ids(module: Any, tokenizer: Any) -> tuple[list[int], int]:
        return eos_and_pad(module, tokenizer)

    def stop_ids(self, module: Any, tokenizer: Any) -> tuple[list[int], int]:
        """EOS ids generation stops at (none with ``rollout.ignore_eos``) and the pad id."""
        eos_ids, pad_id = self.token_ids(module, tokenizer)
        return ([] if self.cfg.actor_rollout_ref.rollout.ignore_eos else eos_ids), pad_id

    @staticmethod
    def repeat_prompts(batch: Any, n: int) -> Any:
        """Each row ``n`` times in a row, with the group id ``uid`` (from ``sample_id``)."""
        if SAMPLE_ID in batch.keys() and UID not in batch.keys():
            # group ids that are the same whichever worker holds the prompt, set on the
            # repeated rows: adding them to a copy of the input batch would copy every
            # non-tensor row too
            out = batch.repeat_interleave(n, dim=0)
            protocol.set_non_tensor(out, UID, [str(i) for i in out[SAMPLE_ID].tolist()])
            return out
        return protocol.repeat_interleave(batch, n)

    @staticmethod
    def prompt_positions(out: Any) -> torch.Tensor:
        if POSITION_IDS in out.keys():
            return out[POSITION_IDS]
        return (out[ATTENTION_MASK].long().cumsum(dim=1) - 1).clamp(min=0)

    def noise_keys(self, rows: Any, n: int) -> torch.Tensor:
        """One random-stream key per (repeated) row: seed, prompt id, sample index within
        its group, training step and call number within the step."""
        count = rows.batch_size[0]
        step = int(getattr(self.worker, "global_step", 0) or 0)
        calls = self._calls[1] + 1 if self._calls[0] == step else 0
        self._calls = (step, calls)
        if SAMPLE_ID in rows.keys():
            ids = rows[SAMPLE_ID].to(torch.int64)
        else:  # no dataloader ids: draw a base from the global RNG (seeded, checkpointed)
            ids = torch.randint(0, 2**62, (1,)) + torch.arange(count) // max(n, 1)
        seed = int(self.cfg.trainer.seed or 0)
        within = torch.arange(count, dtype=torch.int64) % max(n, 1)
        return row_keys(seed, ids.cpu(), within, step, calls)

    @staticmethod
    def finish(out: Any, responses: torch.Tensor, response_mask: torch.Tensor) -> Any:
        """Set the response fields on the repeated batch ``out`` (prompt fields in place)."""
        prompts, prompt_mask = out[INPUT_IDS], out[ATTENTION_MASK]
        prompt_pos = RolloutBase.prompt_positions(out)
        responses = responses.to(prompts.device, prompts.dtype)
        response_mask = response_mask.to(prompts.device)
        width = responses.shape[1]
        steps = torch.arange(1, width + 1, device=prompts.device, dtype=prompt_pos.dtype)
        out.set(PROMPTS, prompts)
        out.set(RESPONSES, responses)
        out.set(RESPONSE_MASK, response_mask)
        out.set(INPUT_IDS, torch.cat([prompts, responses], dim=1))
        out.set(ATTENTION_MASK, torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)],
                                          dim=1))
        out.set(POSITION_IDS, torch.cat([prompt_pos, prompt_pos[:, -1:] + steps], dim=1))
        return out

    @staticmethod
    def metrics(responses: torch.Tensor, response_mask: torch.Tensor,
                eos_ids: list[int]) -> dict:
        lengths = response_mask.sum(dim=1)
        if lengths.numel() == 0:
            return {"rollout/tokens": 0.0}
        width = responses.shape[1]
        eos = torch.tensor(eos_ids, dtype=responses.dtype)
        has_eos = (torch.isin(responses, eos) & response_mask.bool()).any(dim=1)
        clipped = (lengths >= width) & ~has_eos
        return {
            "response_length/mean": lengths.mean().item(),
            "response_length/max": lengths.max().item(),
            "response_length/min": lengths.min().item(),
            "response_length/clip_ratio": clipped.float().mean().item(),
            "rollout/tokens": lengths.sum().item(),
        }
