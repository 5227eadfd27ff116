"""Built-in embodied tasks that run on a CPU with nothing to download."""

from siirl.environment.embodied.tasks.reach2d import Reach2D, expert_action, expert_chunk

__all__ = ["Reach2D", "expert_action", "expert_chunk"]
