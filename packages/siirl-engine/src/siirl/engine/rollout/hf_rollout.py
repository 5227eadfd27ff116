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

Partial rollouts (asynchronous training): ``set_pause_hook(hook)`` makes a training
``generate`` pause between decode steps when ``hook.pending()``, load the new weights
(``hook.swap()``, which calls ``load_weights``) and continue the unfinished responses under
them; each response token then records the version that sampled it (``token_policy_version``)
and each row its oldest token's (``policy_version``). See ``partial_rollout`` for the hook's
contract. No hook (the default) and validation: no pause, no change.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    INPUT_IDS,
    POLICY_VERSION,
    ROLLOUT_LOG_PROBS,
    TOKEN_POLICY_VERSION,
    model_extra_inputs,
)
from siirl.engine.common.runtime import module_device
from siirl.engine.common.sharded_modules import full_weights
from siirl.engine.common.weight_sync import Bucket, copy_into
from siirl.engine.rollout.base import RolloutBase, as_int, postprocess_responses
from siirl.engine.rollout.partial_rollout import (
    PauseHook,
    check_pause_hook,
    continuation_inputs,
    decode_with_pauses,
    policy_versions,
)
from siirl.engine.rollout.sampler import decode
from siirl.engine.rollout.sampling import sample_next_token

__all__ = ["HFRollout", "decode", "postprocess_responses", "sample_next_token"]


class HFRollout(RolloutBase):
    """Rollout engine ``hf``: ``generate(batch, validate=False) -> NodeOutput``."""

    # it generates with the actor's model: the worker builds the actor even for a graph
    # without an actor node (siirl.dag_worker.walk.engines)
    peer_roles = ("actor",)

    def __init__(self, role: str = "rollout", config: Any = None, worker: Any = None,
                 module: torch.nn.Module | None = None, tokenizer: Any = None,
                 peers: Mapping[str, Any] | None = None):
        super().__init__(role, config, worker, peers)
        self._module = module
        self._tokenizer = tokenizer
        self._pause_hook: PauseHook | None = None

    def set_pause_hook(self, hook: PauseHook | None) -> None:
        """Partial rollouts: training ``generate`` calls pause for new weights when
        ``hook.pending()`` and continue under them (``partial_rollout``); None clears it."""
        check_pause_hook(hook, "HFRollout")
        self._pause_hook = hook

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

    def reports_log_probs(self) -> bool:
        """Whether training rollouts carry ``rollout_log_probs``: asked for
        (``rollout.calculate_log_probs``) or read by ``algorithm.rollout_correction``."""
        return bool(self.cfg.actor_rollout_ref.rollout.calculate_log_probs) or \
            self.cfg.algorithm.rollout_correction.corrects

    def load_weights(self, buckets: Iterable[Bucket]) -> int:
        """Weight sync: copy the named tensors into the model this rollout generates with;
        the bytes copied. Nothing moves when that model is the one the actor trains in
        place (the stream is then left unread, so nothing is gathered either)."""
        if self._module is None and getattr(self.actor, "trains_module_in_place", False):
            return 0
        return copy_into(self.policy()[0], buckets)

    def generate(self, batch: Any, validate: bool = False) -> NodeOutput:
        module, tokenizer = self.policy()
        params = self.sampling(validate)
        width = self.max_response_length()
        eos_ids, pad_id = self.stop_ids(module, tokenizer)
        n = params.pop("n")
        out = self.repeat_prompts(batch, n)
        keys = self.noise_keys(out, n)
        prompts, prompt_mask = out[INPUT_IDS], out[ATTENTION_MASK]
        prompt_pos = self.prompt_positions(out)
        extras = {k: out[k] for k in model_extra_inputs if k in out.keys()}
        device = module_device(module)  # FSDP2 CPU offload: the mesh's device
        chunk = as_int(self.cfg.actor_rollout_ref.rollout.max_num_seqs) or prompts.shape[0] or 1
        # eval() turns dropout off; each submodule's mode is restored afterwards, so
        # submodules frozen in eval mode by the actor stay so
        modes = [(m, m.training) for m in module.modules()]
        module.eval()
        parts, log_prob_parts = [], []
        with_log_probs = not validate and self.reports_log_probs()
        hook = None if validate else self._pause_hook
        versions = None  # (per-token versions [B, R], the version at the start): with a hook
        try:
            reshard = bool(self.cfg.actor_rollout_ref.actor.fsdp_config.reshard_after_forward)
            if hook is not None:
                def run(index, prefix, pause):  # rows `index` after their `prefix` tokens
                    ids, mask, pos = continuation_inputs(
                        prompts[index].to(device), prompt_mask[index].to(device),
                        prompt_pos[index].to(device), prefix.to(device))
                    return decode(module, ids, mask, pos, width - prefix.shape[1], eos_ids,
                                  pad_id, **params, keys=keys[index].to(device),
                                  extras={k: v[index].to(device) for k, v in extras.items()},
                                  with_log_probs=with_log_probs, first_draw=prefix.shape[1],
                                  pause=pause)

                first_version = int(hook.version())
                tokens, log_probs, per_token = decode_with_pauses(
                    hook, lambda: full_weights(module, reshard), run, prompts.shape[0],
                    width, chunk, pad_id, with_log_probs)
                parts.append(postprocess_responses(tokens, width, eos_ids, pad_id))
                log_prob_parts += [] if log_probs is None else [log_probs]
                versions = (per_token, first_version)
            else:
                # sharded: weights gathered once per call, then every forward is local
                with full_weights(module, reshard):
                    for start in range(0, prompts.shape[0], chunk):
                        rows = slice(start, start + chunk)
                        tokens = decode(module, prompts[rows].to(device),
                                        prompt_mask[rows].to(device),
                                        prompt_pos[rows].to(device), width, eos_ids, pad_id,
                                        **params, keys=keys[rows].to(device),
                                        extras={k: v[rows].to(device)
                                                for k, v in extras.items()},
                                        with_log_probs=with_log_probs)
                        if with_log_probs:
                            tokens, log_probs = tokens
                            log_prob_parts.append(torch.nn.functional.pad(
                                log_probs.cpu(), (0, width - log_probs.shape[1])))
                        parts.append(postprocess_responses(tokens.cpu(), width, eos_ids,
                                                           pad_id))
        finally:
            for m, mode in modes:
                m.training = mode
        return self._finish(out, parts, log_prob_parts, eos_ids, versions)

    def _finish(self, out: Any, parts: list, log_prob_parts: list, eos_ids: list[int],
                versions: tuple[torch.Tensor, int] | None = None) -> NodeOutput:
        """The response fields from the chunks' ``(responses, response_mask)`` and
        log-probs, and, for a call with a pause hook, the policy versions."""
        responses = torch.cat([p[0] for p in parts])
        response_mask = torch.cat([p[1] for p in parts])
        self.finish(out, responses, response_mask)
        if log_prob_parts:
            out.set(ROLLOUT_LOG_PROBS, torch.cat(log_prob_parts) * response_mask)
        if versions is not None:
            per_token, oldest = policy_versions(versions[0], response_mask, versions[1])
            out.set(TOKEN_POLICY_VERSION, per_token.to(out[INPUT_IDS].device))
            out.set(POLICY_VERSION, oldest.to(out[INPUT_IDS].device))
        return NodeOutput(batch=out, metrics=self.metrics(responses, response_mask, eos_ids))
