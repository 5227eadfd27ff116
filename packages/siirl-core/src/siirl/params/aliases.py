"""verl's spellings of keys this schema names otherwise, moved to their place after the
overrides are applied (so a pasted verl script means here what it means there), and
siiRL's implied settings.

- ``reward_model.reward_kwargs.overlong_buffer_cfg.{enable,len,penalty_factor,log}``
  (verl's DAPO recipe) -> ``reward_model.overlong_buffer.*``;
- ``reward_model.reward_kwargs.max_resp_len`` (the same recipe: the length the overlong
  penalty counts from) must equal ``data.max_response_length``, which the reward managers
  read; it is then dropped, as the managers take no such keyword;
- ``algorithm.adv_estimator=cpgd`` turns on ``actor_rollout_ref.actor.use_cpgd_loss``, as
  siiRL's launcher does;
- verl's ``trainer.profile_steps`` (a list of steps) turns on ``profiler.enable`` for
  ``profiler.profile_steps`` = those steps.
"""

from __future__ import annotations

from typing import List

from omegaconf import DictConfig, OmegaConf, open_dict

KWARGS = "reward_model.reward_kwargs"
OVERLONG = "reward_model.overlong_buffer"


def apply_aliases(cfg: DictConfig) -> List[str]:
    """Move the aliased keys in place; the problems found (unknown sub-keys, conflicts)."""
    if str(OmegaConf.select(cfg, "algorithm.adv_estimator", default="")).lower() == "cpgd":
        OmegaConf.update(cfg, "actor_rollout_ref.actor.use_cpgd_loss", True)
    steps = OmegaConf.select(cfg, "trainer.profile_steps")
    if steps:
        OmegaConf.update(cfg, "profiler.enable", True)
        OmegaConf.update(cfg, "profiler.profile_steps", list(steps), merge=False)
    kwargs = OmegaConf.select(cfg, KWARGS)
    if not isinstance(kwargs, DictConfig):
        return []
    problems: List[str] = []
    with open_dict(cfg):
        buffer_cfg = kwargs.pop("overlong_buffer_cfg", None)
        if buffer_cfg is not None:
            target = OmegaConf.select(cfg, OVERLONG)
            if not isinstance(buffer_cfg, DictConfig):
                problems.append(f"{KWARGS}.overlong_buffer_cfg={buffer_cfg!r}: must be a "
                                f"mapping of {', '.join(target)} (verl's name for {OVERLONG})")
            else:
                for key, value in buffer_cfg.items():
                    if key not in target:
                        problems.append(f"{KWARGS}.overlong_buffer_cfg.{key}: unknown; verl's "
                                        f"overlong buffer takes {', '.join(target)}")
                        continue
                    OmegaConf.update(cfg, f"{OVERLONG}.{key}", value, merge=True)
        max_resp_len = kwargs.pop("max_resp_len", None)
        limit = OmegaConf.select(cfg, "data.max_response_length")
        if max_resp_len is not None and max_resp_len != limit:
            problems.append(f"{KWARGS}.max_resp_len={max_resp_len} differs from "
                            f"data.max_response_length={limit}: the overlong penalty counts "
                            "from data.max_response_length here; set the two equal")
    return problems
