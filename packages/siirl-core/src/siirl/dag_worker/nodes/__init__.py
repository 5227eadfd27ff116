"""The built-in node functions a pipeline names: advantages, ReMax's baseline, and the
group filters (DAPO's dynamic sampling, the embodied accuracy filter)."""
