"""``vllm`` rollout: sample responses with an in-process vLLM engine owned by the worker.

The engine holds its own copy of the policy. It starts from dummy weights (verl's default
``load_format``) or the model directory, and gets the actor's weights through the worker's
weight-sync step: HF-named tensors streamed bucket by bucket into vLLM's in-place reload
(``reload_weights``), after which the prefix cache is dropped, since it holds keys and
values of the old weights.

Each prompt is one request for its ``n`` samples (its prompt is prefilled once), seeded by
the group's noise key (as the ``hf`` rollout keys its noise), so a prompt's samples do not
depend on what else is in the batch. ``rollout.seed_per_prompt=false`` trades that for
speed (vLLM's per-request generators cost about 10% of a tiny model's sampling): the call's
requests go unseeded and vLLM's sampler draws from the torch RNG, seeded for the call by its
first group's key inside a forked RNG state, so a rerun (or a resume) of the same batch
still samples the same tokens.
The sampled tokens' log-probs come back as ``rollout_log_probs`` (temperature applied, as
the trainer computes its own).

``rollout.mode=server`` (verl's ``async``) keeps all of this but runs the engine as a
``vllm serve`` process of the worker's (``vllm_server.ServerEngine``), driven over HTTP.
``sglang_rollout.SGLangRollout`` is this rollout with an SGLang server as its engine.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Tuple

import torch

from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator.fields import (
    ATTENTION_MASK,
    INPUT_IDS,
    POLICY_VERSION,
    ROLLOUT_LOG_PROBS,
    TOKEN_POLICY_VERSION,
)
from siirl.engine.common.runtime import resolve_device
from siirl.engine.common.weight_sync import Bucket
from siirl.engine.rollout import vllm_engine
from siirl.engine.rollout.base import RolloutBase, postprocess_responses
from siirl.engine.rollout.partial_rollout import check_pause_hook, policy_versions
from siirl.errors import ConfigError

_SEED_BITS = (1 << 63) - 1


def _padded(values: list, width: int, fill: Any) -> list:
    """``values`` cut or filled with ``fill`` to exactly ``width`` items."""
    values = list(values[:width])
    return values + [fill] * (width - len(values))


def tied_weights(module: Any) -> dict:
    """``{tied name: source name}`` of an HF model (e.g. lm_head.weight ->
    model.embed_tokens.weight when the embeddings are tied)."""
    ties = dict(getattr(module, "all_tied_weights_keys", None) or {})
    config = getattr(module, "config", None)
    if not ties and getattr(config, "tie_word_embeddings", False):
        ties = {"lm_head.weight": "model.embed_tokens.weight"}
    return ties


class VLLMRollout(RolloutBase):
    """Rollout engine ``vllm``: ``generate(batch, validate=False) -> NodeOutput``."""

    # the actor's tokenizer and EOS ids; its weights through the weight sync
    peer_roles = ("actor",)
    rollout_name = "vllm"  # in messages

    def __init__(self, role: str = "rollout", config: Any = None, worker: Any = None,
                 peers: Mapping[str, Any] | None = None, llm: Any = None):
        super().__init__(role, config, worker, peers)
        rollout = self.cfg.actor_rollout_ref.rollout
        self.device_type = resolve_device(self.cfg).type
        self._check_settings(rollout)
        self.server_mode = vllm_engine.server_mode(rollout)
        self.free_cache = vllm_engine.free_cache(rollout, self.device_type)
        # dummy weights until the first sync: the worker syncs before the first generate
        self.needs_weights = vllm_engine.starts_with_dummy_weights(rollout)
        self.llm = llm if llm is not None else self._start()
        self._asleep = False
        self._pause_hook: Any = None
        self._sleep()

    def set_pause_hook(self, hook: Any) -> None:
        """Partial rollouts (``partial_rollout.PauseHook``): a training ``generate`` stops
        its requests when ``hook.pending()``, has the new weights loaded and goes on with the
        unfinished responses under them (``server_pauses``; server mode only); None clears
        it."""
        if hook is not None and not hasattr(self.llm, "sample_with_pauses"):
            raise ConfigError(f"partial rollouts with the {self.rollout_name} rollout need "
                              "its server mode (actor_rollout_ref.rollout.mode=server)")
        check_pause_hook(hook, type(self).__name__)
        self._pause_hook = hook

    def _check_settings(self, rollout: Any) -> None:
        vllm_engine.check_settings(rollout, self.device_type)

    def _engine_kwargs(self) -> dict:
        from transformers import AutoConfig

        model_path = self.cfg.actor_rollout_ref.model.path
        model_dir = vllm_engine.model_directory(model_path)
        hf_config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        vllm_engine.check_model(hf_config, model_path, self.device_type)
        kwargs, _ = vllm_engine.engine_kwargs(self.cfg, hf_config, model_dir, self.device_type)
        return kwargs

    def _start(self) -> Any:
        if not self.server_mode:
            # an asynchronous run's rollout workers generate apart: each engine alone
            return vllm_engine.start_engine(self._engine_kwargs(),
                                            self.cfg.actor_rollout_ref.model.path,
                                            alone=bool(self.cfg.async_training.enable))
        from siirl.engine.rollout.vllm_server import ServerEngine

        kwargs = self._engine_kwargs()
        run_dir = self.cfg.trainer.default_local_dir
        log_dir = Path(run_dir) if run_dir else Path(tempfile.mkdtemp(prefix="siirl-vllm-"))
        rank = int(getattr(self.worker, "rank", 0) or 0)
        return ServerEngine(kwargs, float(self.cfg.actor_rollout_ref.rollout.server_timeout_s),
                            log_dir / f"vllm_server_rank{rank}.log")

    def close(self) -> None:
        """Stop the server of the server mode (else a no-op: the engine is in-process)."""
        if self.server_mode:
            self.llm.close()

    # -- sleep mode (CUDA): KV cache and weights freed while the trainer runs -------------
    def _sleep(self) -> None:
        if self.free_cache and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    # -- weight sync ----------------------------------------------------------------------
    def load_weights(self, buckets: Iterable[Bucket]) -> int:
        """Stream the named tensors into the engine's model in place; the bytes loaded."""
        moved = [0]
        # a tied head goes with its source tensor: megatron's export leaves it out, and
        # vLLM re-processes a layer (its CPU LM head keeps a packed copy) only when that
        # layer's own weights arrive
        ties = tied_weights(self.actor.module)
        sources = {source: target for target, source in ties.items()}

        def named() -> Iterator[Tuple[str, torch.Tensor]]:
            for bucket in buckets:  # gathered bucket by bucket, as vLLM consumes them
                for name, tensor in bucket:
                    moved[0] += tensor.numel() * tensor.element_size()
                    if name in ties:
                        continue  # sent with its source
                    yield name, tensor
                    if name in sources:
                        yield sources[name], tensor

        self._wake()
        try:
            if self.server_mode:  # files the server loads in place; its cache dropped
                self.llm.reload_weights(named())
            else:
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named()})
                self.llm.reset_prefix_cache()  # cached keys/values came from the old weights
        finally:
            self._sleep()
        self.needs_weights = False
        return moved[0]

    # -- generation -----------------------------------------------------------------------
    def request_fields(self, params: dict, n: int, width: int, eos_ids: list,
                       keys: torch.Tensor) -> list:
        """Sampling settings of the one request per prompt (for its ``n`` samples), seeded
        by the group's noise key; the names of vLLM's ``SamplingParams`` and its HTTP API."""
        ignore_eos = bool(self.cfg.actor_rollout_ref.rollout.ignore_eos)
        common = dict(n=n, max_tokens=width, logprobs=0, ignore_eos=ignore_eos,
                      stop_token_ids=list(eos_ids), top_p=params["top_p"],
                      top_k=params["top_k"] if params["top_k"] > 0 else 0)
        if params["greedy"]:
            return [dict(temperature=0.0, **common) for _ in range(len(keys))]
        if not self.cfg.actor_rollout_ref.rollout.seed_per_prompt:
            return [dict(temperature=params["temperature"], **common) for _ in range(len(keys))]
        return [dict(temperature=params["temperature"], seed=int(key) & _SEED_BITS, **common)
                for key in keys.tolist()]

    def _sample(self, prompts: list, requests: list, call_seed: int | None = None) -> list:
        """``[(token ids, their log-probs or None)]``: the samples of every prompt in order.
        ``call_seed`` seeds the torch RNG that unseeded requests draw from (in-process)."""
        if self.server_mode:
            return self.llm.sample(prompts, requests)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        devices = [torch.cuda.current_device()] if self.device_type == "cuda" else []
        with torch.random.fork_rng(devices=devices, enabled=call_seed is not None):
            if call_seed is not None:
                torch.manual_seed(call_seed)
            results = self.llm.generate(
                [TokensPrompt(prompt_token_ids=p) for p in prompts],
                [SamplingParams(detokenize=False, **r) for r in requests], use_tqdm=False)
        return [(list(sample.token_ids),
                 [position[token].logprob for position, token
                  in zip(sample.logprobs, sample.token_ids, strict=True)]
                 if sample.logprobs else None)
                for result in results for sample in result.outputs]

    def generate(self, batch: Any, validate: bool = False) -> NodeOutput:
        if self.needs_weights:
            raise RuntimeError(f"the {self.rollout_name} rollout still holds dummy weights: the "
                               "worker's weight sync must run before the first generate")
        params = self.sampling(validate)
        width = self.max_response_length()
        eos_ids, pad_id = self.stop_ids(self.actor.module, self.actor.tokenizer)
        n = params.pop("n")
        out = self.repeat_prompts(batch, n)
        group_keys = self.noise_keys(out, n)[::n]  # the first sample's key names its group
        prompts = [row[mask.bool()].tolist()
                   for row, mask in zip(out[INPUT_IDS][::n], out[ATTENTION_MASK][::n],
                                        strict=True)]
        requests = self.request_fields(params, n, width, eos_ids, group_keys)
        unseeded = "seed" not in requests[0] and not params["greedy"] if requests else False
        hook = None if validate else self._pause_hook
        first_version = int(hook.version()) if hook is not None else None
        self._wake()
        try:
            if hook is not None:
                samples = self.llm.sample_with_pauses(prompts, requests, width, hook,
                                                      self._wake)
            else:
                samples = self._sample(
                    prompts, requests, int(group_keys[0]) & _SEED_BITS if unseeded else None)
        finally:
            self._sleep()
        # padded Python lists, then one tensor each: a tensor per row costs more than vLLM
        tokens = torch.tensor([_padded(s[0], width, pad_id) for s in samples],
                              dtype=torch.long).view(-1, width)
        log_probs = torch.tensor([_padded(s[1] or [], width, 0.0) for s in samples],
                                 dtype=torch.float32).view(-1, width)
        responses, response_mask = postprocess_responses(tokens, width, eos_ids, pad_id)
        self.finish(out, responses, response_mask)
        out.set(ROLLOUT_LOG_PROBS, log_probs * response_mask)
        if hook is not None:  # each token's weight version, each row its oldest token's
            versions = torch.tensor([_padded(s[2], width, -1) for s in samples],
                                    dtype=torch.long).view(-1, width)
            per_token, oldest = policy_versions(versions, response_mask, first_version)
            out.set(TOKEN_POLICY_VERSION, per_token.to(out[INPUT_IDS].device))
            out.set(POLICY_VERSION, oldest.to(out[INPUT_IDS].device))
        return NodeOutput(batch=out, metrics=self.metrics(responses, response_mask, eos_ids))
