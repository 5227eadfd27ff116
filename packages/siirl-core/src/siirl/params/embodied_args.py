"""Schema of siiRL's embodied settings (``actor_rollout_ref.embodied``), names and defaults
as in siiRL's ``embodied_args.py``, so its launch scripts parse; the EMBODIED rollout
(siirl-envs) reads them. Two differ: ``env.env_config`` and ``env.step_timeout_s`` are this
project's (the environment's own settings, and the simulator deadline), and
``video_embedding_model_path`` is empty by default (plain GRPO on success; SRPO when it
names an encoder: ``builtin`` or a transformers V-JEPA 2 folder). Settings only siiRL's
OpenVLA path reads are listed in ``key_rules`` as not applying."""

from dataclasses import dataclass, field
from typing import Any, Dict


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
