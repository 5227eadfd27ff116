"""The multi-turn section of siirl-envs (``actor_rollout_ref.rollout.multi_turn``): verl's
multi-turn / tool-calling rollout settings, names and defaults as in verl, with the rules of
the keys this release does not read. The ``multi_turn`` rollout plugin, its tools and
interactions read it; siiRL's multi-agent rollout (siirl-core) reads its turn bound
(``max_assistant_turns``) and ``use_all_traj``, where the section is installed. Registered as
``siirl.config: multi_turn``; nothing heavy is imported here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from siirl.params.key_conditions import get
from siirl.params.key_rule_kinds import Rule, notice
from siirl.params.sections import ConfigSection, Mount, custom_workflow
from siirl.params.value_rules import at_least

KEY = "actor_rollout_ref.rollout.multi_turn"


@dataclass
class MultiTurnArguments:
    """Multi-turn / tool-calling rollout settings."""

    enable: bool = False
    max_turns: int | None = None
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    tool_config_path: str | None = None
    interaction_config_path: str | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    use_inference_chat_template: bool = False
    tokenization_sanity_check_mode: str = "strict"
    format: str = "hermes"
    # multi-agent workflows (siiRL): train every turn of an episode (unsupported) or the last
    use_all_traj: bool = False


def multi_turn_rules(mount: Mount) -> List[Rule]:
    at = mount.path
    return [
        notice((f"{at}.max_turns", f"{at}.use_inference_chat_template",
                f"{at}.tokenization_sanity_check_mode"),
               "no effect: a conversation is one token list",
               "the conversation keeps the model's own tokens and renders tool turns with the "
               "tokenizer's chat template, so nothing is re-tokenized or checked; bound turns "
               "with multi_turn.max_assistant_turns / max_user_turns (max_turns is verl's old "
               "name)."),
        notice(tuple(f"{at}.{k}" for k in (
                "max_assistant_turns", "max_user_turns", "tool_config_path",
                "interaction_config_path", "max_parallel_calls", "max_tool_response_length",
                "tool_response_truncate_side", "format")), "no effect: multi-turn is off",
               f"multi_turn settings only act with {at}.enable=true "
               "(max_assistant_turns also in a multi-agent workflow file).",
               lambda config, key: not get(config, f"{at}.enable", False) and not (
                   key.endswith("max_assistant_turns") and custom_workflow(config))),
    ]


# read wherever a rollout runs (the multi_turn plugin wraps the engine of rollout.name), so
# no selector: its own rules name what is read only with enable=true
SECTION = ConfigSection(
    schema=MultiTurnArguments,
    mounts=(Mount(KEY, "rollout", after="val_kwargs"),),
    rules=multi_turn_rules,
    value_rules=(at_least(1, (f"{KEY}.max_parallel_calls", f"{KEY}.max_tool_response_length")),
                 at_least(1, f"{KEY}.max_*turns", " (or null)")),
)
