"""``hf`` rollout: sample responses with the actor's own transformers module.

No second copy of the weights: the module is the actor engine's (wired in as a peer),
looked up on every call, so an optimizer step of an actor that trains it in place (fsdp)
is visible to the next rollout as is; an actor that trains another copy (megatron) hands
its weights over through the worker's weight-sync step (``load_weights``).

Decoding is a KV-cached loop of our own (``sampler``) rather than ``model.generate``: each
prompt is prefilled once for its ``n`` samples and finished rows leave the batch, with
exactly the tokens of the plain loop (``reference``); sampling (temperature, top-k, top-p)
is the one documented in ``sampling``, independent of the model's generation_config.

Randomness is per row (``keyed_random``): a response's noise is keyed by the run seed, the
prompt's ``sample_id`` (from the dataloader), its index among the ``n`` samples, the
training step and the token position, so the same prompt gets the same response whichever
worker generates it and whatever else is in the batch. Batches without ``sample_id`` key
their rows from torch's global RNG instead.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch

from siirl.dag_worker.data_structures import NodeOutput
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
from siirl.engine.common.sharded_modules import full_weights
from siirl.engine.common.weight_sync import Bucket, copy_into
from siirl.engine.rollout.keyed_random import row_keys
from siirl.engine.rollout.sampler import decode
from siirl.engine.rollout.sampling import sample_next_token

__all__ = ["HFRollout", "decode", "postprocess_responses", "sample_next_token"]


def _as_int(value: Any) -> int | None:
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


class HFRollout:
    """Rollout engine ``hf``: ``generate(batch, validate=False) -> NodeOutput``."""

    # it generates with the actor's model: the worker builds the actor even for a graph
    # without an actor node (siirl.dag_worker.engines)
    peer_roles = ("actor",)

    def __init__(self, role: str = "rollout", config: Any = None, worker: Any = None,
                 module: torch.nn.Module | None = None, tokenizer: Any = None,
                 peers: Mapping[str, Any] | None = None):
        self.role = role
        self.config = config
        self.cfg = typed_config(config)  # read once; defaults are the schema's
        self.worker = worker
        self._module = module
        self._tokenizer = tokenizer
        # the actor engine whose model generates (wired by the worker; None with module=)
        self.actor = (peers or {}).get("actor")
        self._calls = (-1, 0)  # (training step, generate calls within it): a noise salt

    # -- the policy is looked up on each call, so a swapped-in actor module is used too --
    def policy(self) -> tuple[torch.nn.Module, Any]:
        module, tokenizer = self._module, self._tokenizer
        if module is None or tokenizer is None:
            if self.actor is None:
                raise RuntimeError("HFRollout needs peers={'actor': <actor engine>} or "
                                   "module= and tokenizer=")
            module = module if module is not None else self.actor.module
            tokenizer = tokenizer if tokenizer is not None else self.actor.tokenizer
        # a DDP/FSDP1-style wrapper has no generate machinery of its own: use the inner model
        while not hasattr(module, "config") and isinstance(getattr(module, "module", None),
                                                           torch.nn.Module):
            module = module.module
        return module, tokenizer

    def load_weights(self, buckets: Iterable[Bucket]) -> int:
        """Weight sync: copy the named tensors into the model this rollout generates with;
        the bytes copied. Nothing moves when that model is the one the actor trains in
        place (the stream is then left unread, so nothing is gathered either)."""
        if self._module is None and getattr(self.actor, "trains_module_in_place", False):
            return 0
        return copy_into(self.policy()[0], buckets)

    def sampling(self, validate: bool) -> dict:
        """n, greedy, temperature, top_k, top_p for training or validation."""
        rollout = self.cfg.actor_rollout_ref.rollout
        base = rollout.val_kwargs if validate else rollout
        temperature = float(base.temperature or 0.0)
        do_sample = bool(base.do_sample)
        top_k = _as_int(base.top_k) or -1
        return {
            "n": _as_int(base.n) or 1,
            "greedy": (not do_sample) or temperature <= 0.0,
            "temperature": temperature if temperature > 0 else 1.0,
            "top_k": top_k if top_k > 0 else -1,  # -1 and 0 both mean "off"
            "top_p": float(base.top_p),
        }

    def max_response_length(self) -> int:
        length = _as_int(self.cfg.data.max_response_length)
        length = length if length is not None else _as_int(
            self.cfg.actor_rollout_ref.rollout.response_length)
        if length is None:
            raise ValueError("set data.max_response_length (or rollout.response_length)")
        return length

    @staticmethod
    def token_ids(module: torch.nn.Module, tokenizer: Any) -> tuple[list[int], int]:
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

    def generate(self, batch: Any, validate: bool = False) -> NodeOutput:
        module, tokenizer = self.policy()
        params = self.sampling(validate)
        width = self.max_response_length()
        eos_ids, pad_id = self.token_ids(module, tokenizer)
        if self.cfg.actor_rollout_ref.rollout.ignore_eos:
            eos_ids = []
        n = params.pop("n")
        if SAMPLE_ID in batch.keys() and UID not in batch.keys():
            # group ids that are the same whichever worker holds the prompt, set on the
            # repeated rows: adding them to a copy of the input batch would copy every
            # non-tensor row too
            out = batch.repeat_interleave(n, dim=0)
            protocol.set_non_tensor(out, UID, [str(i) for i in out[SAMPLE_ID].tolist()])
        else:
            out = protocol.repeat_interleave(batch, n)
        keys = self.noise_keys(out, n)
        prompts, prompt_mask = out[INPUT_IDS], out[ATTENTION_MASK]
        if POSITION_IDS in out.keys():
            prompt_pos = out[POSITION_IDS]
        else:
            prompt_pos = (prompt_mask.long().cumsum(dim=1) - 1).clamp(min=0)
        device = next(module.parameters()).device
        chunk = _as_int(self.cfg.actor_rollout_ref.rollout.max_num_seqs) or prompts.shape[0] or 1
        # eval() turns dropout off; each submodule's mode is restored afterwards, so
        # submodules frozen in eval mode by the actor stay so
        modes = [(m, m.training) for m in module.modules()]
        module.eval()
        parts = []
        try:
            reshard = bool(self.cfg.actor_rollout_ref.actor.fsdp_config.reshard_after_forward)
            # sharded: weights gathered once per call, then every forward is local
            with full_weights(module, reshard):
                for start in range(0, prompts.shape[0], chunk):
                    rows = slice(start, start + chunk)
                    tokens = decode(module, prompts[rows].to(device),
                                    prompt_mask[rows].to(device), prompt_pos[rows].to(device),
                                    width, eos_ids, pad_id, **params, keys=keys[rows].to(device))
                    parts.append(postprocess_responses(tokens.cpu(), width, eos_ids, pad_id))
        finally:
            for m, mode in modes:
                m.training = mode
        responses = torch.cat([p[0] for p in parts]).to(prompts.device, prompts.dtype)
        response_mask = torch.cat([p[1] for p in parts]).to(prompts.device)
        steps = torch.arange(1, width + 1, device=prompts.device, dtype=prompt_pos.dtype)
        out.set(PROMPTS, prompts)
        out.set(RESPONSES, responses)
        out.set(RESPONSE_MASK, response_mask)
        out.set(INPUT_IDS, torch.cat([prompts, responses], dim=1))
        out.set(ATTENTION_MASK, torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)],
                                          dim=1))
        out.set(POSITION_IDS, torch.cat([prompt_pos, prompt_pos[:, -1:] + steps], dim=1))
        return NodeOutput(batch=out, metrics=self.metrics(responses, response_mask, eos_ids))

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
