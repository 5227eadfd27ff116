"""Embodied environments over existing simulators, through the :class:`EmbodiedEnv` API.

- ``robosuite`` (extra ``siirl-envs[robosuite]``): robosuite's own single-arm tasks
  (``Lift``, ``Stack``, ...) with a Panda arm, see :mod:`.robosuite`.
- ``libero`` (extra ``siirl-envs[libero]``, plus LIBERO's scene assets): the LIBERO
  suites ``libero_spatial``, ``libero_object``, ``libero_goal``, ``libero_10``, see
  :mod:`.libero`.

Both are MuJoCo through robosuite 1.4 and share :class:`.common.ArmEnv`. Importing this
package imports no simulator: each adapter imports its own when an environment is built,
and a missing package or renderer is a clear error naming the install command.
"""
