"""siirl-engine: model engines (actor, critic, reference, rollout) and reward managers.

Engines reach siirl-core only through the entry-point groups ``siirl.engines``,
``siirl.rollouts`` and ``siirl.reward_managers`` declared in this distribution's
pyproject.toml; importing this package never imports an optional backend.
"""
