"""The embodied section of siirl-envs (``actor_rollout_ref.embodied``): siiRL's embodied
settings, names and defaults as in siiRL's ``embodied_args.py``, so its launch scripts parse;
the EMBODIED rollout reads them. Two differ: ``env.env_config`` and ``env.step_timeout_s``
are this project's (the environment's own settings, and the simulator deadline), and
``video_embedding_model_path`` is empty by default (plain GRPO on success; SRPO when it
names an encoder: ``builtin`` or a transformers V-JEPA 2 folder). Settings only siiRL's
OpenVLA path reads are not applying (the section's rule). Registered as
``siirl.config: embodied``; nothing heavy is imported here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List

from siirl.params.key_rule_kinds import Rule, notice
from siirl.params.sections import ConfigSection, Mount

_OPENVLA_ONLY = ("embodied_type", "model_path", "embedding_img_size", "embedding_model_class",
                 "embedding_model_offload", "num_images_in_input", "center_crop", "unnorm_key",
                 "n_gpus_per_node", "temperature", "env.num_trials_per_task", "env.model_family")


@dataclass
class EmbodiedEnvironmentArguments:
    """The simulator: suite, parallel environments, episode length, trials per task."""

    env_type: str = field(default="libero", metadata={
        "help": "The embodied environment: reach (built in), robosuite, libero, or one "
                "registered under siirl.environments."})
    env_name: str = field(default="libero_10", metadata={
        "help": "A LIBERO suite, or the task ids to play (comma separated; all: every one)."})
    env_config: Dict[str, Any] = field(default_factory=dict, metadata={
        "help": "The environment's own settings (its constructor's keywords)."})
    num_envs: int = field(default=16, metadata={
        "help": "Environment processes per worker (episodes play in waves of this many); "
                "0: in the worker's own process."})
    step_timeout_s: float = field(default=60.0, metadata={
        "help": "A simulator call that takes longer is killed and restarted, its episode "
                "dropped and counted."})
    max_steps: int = 512
    action_order: List[int] = field(default_factory=list, metadata={
        "help": "siiRL's learning control: the environment's action dimension i takes the "
                "policy's dimension action_order[i] (a permutation; []: unchanged)."})
    action_signs: List[float] = field(default_factory=list, metadata={
        "help": "siiRL's learning control: each environment action dimension times 1 or -1 "
                "(e.g. [-1, 1] mirrors x; []: unchanged)."})
    num_trials_per_task: int = 50
    num_steps_wait: int = 10
    model_family: str = "openvla"


@dataclass
class EmbodiedArguments:
    """A vision-language-action policy: action tokens, chunks, images, video embeddings."""

    env: EmbodiedEnvironmentArguments = field(default_factory=EmbodiedEnvironmentArguments)
    embodied_type: str = field(default="openvla", metadata={"help": "openvla or openvla-oft."})
    model_path: str = "openvla/openvla-7b"
    video_embedding_model_path: str = field(default="", metadata={
        "help": "SRPO's frozen video encoder: builtin, or a transformers V-JEPA 2 folder; "
                "empty: no progress reward (GRPO on success)."})
    action_chunks_len: int = 8
    action_token_len: int = 7
    embedding_img_size: int = 384
    embedding_enable_fp16: bool = True
    embedding_model_class: str | None = None
    embedding_model_offload: bool = False
    num_images_in_input: int = 1
    center_crop: bool = True
    unnorm_key: str = "libero_10"
    temperature: float = 1.6
    n_gpus_per_node: int = 8


def embodied_rules(mount: Mount) -> List[Rule]:
    return [notice(tuple(f"{mount.path}.{k}" for k in _OPENVLA_ONLY),
                   "read by siiRL's OpenVLA path only",
                   "these configure siiRL's OpenVLA models (image preprocessing, action "
                   "un-normalisation, their own GPU count); here the model is "
                   "actor_rollout_ref.model, its forward takes pixel_values and proprio, "
                   "sampling uses actor_rollout_ref.rollout.temperature, and the dataloader's "
                   "rows name the trials.")]


# read by the EMBODIED workflow and by custom workflows that play embodied episodes, so no
# selector: its own rule names what no workflow here reads
SECTION = ConfigSection(
    schema=EmbodiedArguments,
    mounts=(Mount("actor_rollout_ref.embodied", "embodied", after="rollout"),),
    rules=embodied_rules,
)
