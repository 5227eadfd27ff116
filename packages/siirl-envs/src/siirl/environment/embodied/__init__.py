"""Embodied environments: image + proprio + instruction in, action chunks out.

``EmbodiedEnv`` is the API (``reset(task_id, seed)``, ``step(chunk)``, ``render()``,
``close()``); ``VectorEmbodiedEnv`` runs N of them in subprocesses with per-environment
deadlines and restarts; ``make_embodied_env(name, config)`` builds a registered one
(built in: ``reach``, a 2D reach/push family that needs only numpy); ``video`` writes
episode GIFs for validation."""

from siirl.environment.embodied.base import (
    EmbodiedEnv,
    Observation,
    StepResult,
    check_observation,
    clip_actions,
    stack_observations,
)
from siirl.environment.embodied.registry import (
    embodied_env_class,
    embodied_env_names,
    make_embodied_env,
)
from siirl.environment.embodied.tasks.reach2d import Reach2D, expert_action, expert_chunk
from siirl.environment.embodied.venv import EmbodiedEnvError, VectorEmbodiedEnv
from siirl.environment.embodied.video import (
    EpisodeRecorder,
    first_frame_png,
    resize_frame,
    write_video,
)

__all__ = ["EmbodiedEnv", "EmbodiedEnvError", "EpisodeRecorder", "Observation", "Reach2D",
           "StepResult", "VectorEmbodiedEnv", "check_observation", "clip_actions",
           "embodied_env_class", "embodied_env_names", "expert_action", "expert_chunk",
           "first_frame_png", "make_embodied_env", "resize_frame", "stack_observations",
           "write_video"]
