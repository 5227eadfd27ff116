"""Enumerations named by the spec and used to pick a built-in workflow."""

from enum import Enum


class AdvantageEstimator(str, Enum):
    """``algorithm.adv_estimator``: gae selects the PPO workflow (critic), others GRPO."""

    GRPO = "grpo"
    GAE = "gae"
    CPGD = "cpgd"
    GSPO = "gspo"
    REMAX = "remax"  # the remax workflow: a greedy baseline rollout per prompt first


class WorkflowType(str, Enum):
    """``algorithm.workflow_type``: which built-in node flow to run."""

    DEFAULT = "DEFAULT"
    DAPO = "DAPO"
    EMBODIED = "EMBODIED"
    AGENTIC = "AGENTIC"  # multi-turn episodes in environments (pipeline from siirl-envs)
