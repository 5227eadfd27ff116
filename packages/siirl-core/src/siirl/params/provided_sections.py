"""Where the config sections of siiRL's own distributions mount, so that a key of one whose
package is not installed is named with the ``pip install`` that provides it rather than as
an unknown key (``actor_rollout_ref.rollout.multi_turn.enable=true`` without siirl-envs).

The table is to ``siirl.config`` what ``siirl.plugins.PROVIDED`` is to the other groups: the
sections siiRL ships, by the entry-point name that registers them there (its pip line is
``PROVIDED``'s); a test keeps it equal to what those sections mount. A third-party section
needs no entry: its keys are unknown until its package is installed.
"""

from __future__ import annotations

from typing import Optional

from siirl.params.sections import GROUP, installed_sections
from siirl.plugins import PROVIDED, install_hint

# the dotted path a section mounts at -> its entry point in siirl.config. A spliced section
# (siirl-engine's rollout knobs) adds keys to a group of core's, not a group of its own: its
# keys read as unknown while its package is absent
MOUNTS = {
    "actor_rollout_ref.actor.fsdp_config": "fsdp",
    "actor_rollout_ref.ref.fsdp_config": "fsdp",
    "critic.model.fsdp_config": "fsdp",
    "actor_rollout_ref.actor.megatron": "megatron",
    "actor_rollout_ref.ref.megatron": "megatron",
    "critic.megatron": "megatron",
    "reward_model.megatron": "megatron",
    "reward_model.model": "reward_model",
    "reward_model.judge": "reward_judge",
    "actor_rollout_ref.rollout.multi_turn": "multi_turn",
    "actor_rollout_ref.embodied": "embodied",
    "custom_envs": "custom_envs",
    "env_manager": "env_manager",
    "train_env_manager": "env_scheduler",
    "val_env_manager": "env_scheduler",
}


def absent_section_problem(key: str, origin: str = "") -> Optional[str]:
    """The error for ``key`` when it lies in a section siiRL ships whose package this
    environment lacks (None otherwise); ``origin`` names where it was set."""
    for path, name in MOUNTS.items():
        if (key == path or key.startswith(path + ".")) and name not in installed_sections():
            where = f" in {origin}" if origin else ""
            package = PROVIDED[GROUP][name].partition("[")[0]
            return (f"'{key}'{where} belongs to the config section at {path}, which "
                    f"comes with {package}, not installed here: {install_hint(GROUP, name)}")
    return None
