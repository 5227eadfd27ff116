"""Schema of siiRL's embodied settings (``actor_rollout_ref.embodied``), names and defaults
as in siiRL's ``embodied_args.py``, so its launch scripts parse. The embodied rollout that
reads them is not built yet: setting any of them is refused with that reason
(``key_rules``), not silently ignored."""

from dataclasses import dataclass, field


@dataclass
class EmbodiedEnvironmentArguments:
    """The simulator: suite, parallel environments, episode length, trials per task."""

    env_type: str = field(default="libero", metadata={"help": "libero or maniskill."})
    env_name: str = field(default="libero_10", metadata={"help": "Task suite or env name."})
    num_envs: int = 16
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
    video_embedding_model_path: str = "~/models/vjepa/vitg-384.pt"
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
