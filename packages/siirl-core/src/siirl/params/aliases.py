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
  ``profiler.profile_steps`` = those steps;
- verl's ``reward_manager.name`` (its newer spelling of ``reward_model.reward_manager``, which
  it still reads) -> ``reward_model.reward_manager``, the manager the reward role builds;
  with ``reward_manager.source=importlib`` it is the class loaded from
  ``reward_manager.module.path`` (``siirl.dag_worker.walk.reward_manager_file``). The two set to
  different managers is a conflict.
"""

from __future__ import annotations

from typing import List

from omegaconf import DictConfig, OmegaConf, open_dict

from siirl.params.reward_args import RewardModelArguments

KWARGS = "reward_model.reward_kwargs"
OVERLONG = "reward_model.overlong_buffer"
MANAGER, LEGACY_MANAGER = "reward_manager", "reward_model.reward_manager"


def apply_aliases(cfg: DictConfig) -> List[str]:
    """Move the aliased keys in place; the problems found (unknown sub-keys, conflicts)."""
    # cfg is the DictConfig being composed: the schema's groups read as attributes
    if str(cfg.algorithm.adv_estimator).lower() == "cpgd":
        OmegaConf.update(cfg, "actor_rollout_ref.actor.use_cpgd_loss", True)
    steps = cfg.trainer.profile_steps
    if steps:
        OmegaConf.update(cfg, "profiler.enable", True)
        OmegaConf.update(cfg, "profiler.profile_steps", list(steps), merge=False)
    problems = _reward_manager_choice(cfg)
    kwargs = cfg.reward_model.reward_kwargs
    if not isinstance(kwargs, DictConfig):
        return problems
    with open_dict(cfg):
        buffer_cfg = kwargs.pop("overlong_buffer_cfg", None)
        if buffer_cfg is not None:
            target = cfg.reward_model.overlong_buffer
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
        limit = cfg.data.max_response_length
        if max_resp_len is not None and max_resp_len != limit:
            problems.append(f"{KWARGS}.max_resp_len={max_resp_len} differs from "
                            f"data.max_response_length={limit}: the overlong penalty counts "
                            "from data.max_response_length here; set the two equal")
    return problems


def _reward_manager_choice(cfg: DictConfig) -> List[str]:
    """``reward_manager.name`` set (not following ``reward_model.reward_manager`` by its
    default interpolation) becomes ``reward_model.reward_manager``."""
    section = cfg.reward_manager
    if not isinstance(section, DictConfig):
        return []
    importlib_source = section.get("source") == "importlib"
    named = not OmegaConf.is_interpolation(section, "name")
    problems: List[str] = []
    if importlib_source and not named:
        problems.append(f"{MANAGER}.source=importlib needs {MANAGER}.name: the class to load "
                        f"from {MANAGER}.module.path")
    if importlib_source and not section.module.path:
        problems.append(f"{MANAGER}.source=importlib needs {MANAGER}.module.path: the Python "
                        f"file (or pkg://module) holding the class {MANAGER}.name")
    if not named:
        return problems
    name = section.get("name")
    legacy = cfg.reward_model.reward_manager
    if legacy not in (_LEGACY_DEFAULT, name):
        what = "the class to load" if importlib_source else "the same choice"
        problems.append(f"{MANAGER}.name={name!r} and {LEGACY_MANAGER}={legacy!r} name two "
                        f"reward managers ({MANAGER}.name is verl's newer key for {what}): "
                        "set one of them")
    elif name:
        OmegaConf.update(cfg, LEGACY_MANAGER, name)
    return problems


_LEGACY_DEFAULT = RewardModelArguments().reward_manager
