"""Choose the workflow a run executes.

Order: ``dag.custom_pipeline_fn`` ("module:function" returning a TaskGraph or Pipeline),
then ``dag.workflow_path`` (a YAML workflow), then ``dag.pipeline`` (a name registered in
the ``siirl.pipelines`` entry-point group), then ``algorithm.workflow_type`` with
``algorithm.adv_estimator`` (DAPO, or DEFAULT with ``algorithm.filter_groups.enable`` and
group advantages, as verl -> dapo; EMBODIED -> embodied, AGENTIC -> agentic or with
gae agentic_ppo, which siirl-envs registers; otherwise gae -> ppo, remax -> remax (its
greedy baseline rollout first) and anything else -> grpo).
"""

from __future__ import annotations

from typing import Any

from siirl.errors import ConfigError, PipelineError
from siirl.execution.dag.config_loader import load_workflow
from siirl.execution.dag.func_ref import resolve_ref
from siirl.execution.dag.pipeline import Pipeline
from siirl.execution.dag.task_graph import TaskGraph
from siirl.execution.scheduler.enums import AdvantageEstimator, WorkflowType
from siirl.params import SiiRLArguments
from siirl.plugins import load_plugin


def dynamic_sampling_on(config: SiiRLArguments) -> bool:
    """verl turns DAPO's dynamic sampling on from ``algorithm.filter_groups.enable`` alone
    (its DAPO recipe sets no workflow): under the DEFAULT workflow with group advantages,
    that key selects the DAPO pipeline here too."""
    algorithm = config.algorithm
    if config.async_training.enable:  # the stream drops those groups (async_training)
        return False
    return algorithm.workflow_type.upper() == WorkflowType.DEFAULT.value and \
        algorithm.adv_estimator.lower() != AdvantageEstimator.GAE.value and \
        algorithm.filter_groups.enable


def builtin_pipeline_name(config: SiiRLArguments) -> str:
    raw_type = config.algorithm.workflow_type
    try:
        workflow = WorkflowType(raw_type.upper())
    except ValueError:
        names = ", ".join(w.value for w in WorkflowType)
        raise ConfigError(f"algorithm.workflow_type={raw_type!r} is not one of {names}") \
            from None
    estimator = config.algorithm.adv_estimator.lower()
    if estimator == AdvantageEstimator.REMAX.value:
        return _remax_pipeline_name(workflow, dynamic_sampling_on(config))
    if workflow is WorkflowType.DAPO or dynamic_sampling_on(config):
        return "dapo"
    if workflow is WorkflowType.EMBODIED:
        return "embodied"
    if workflow is WorkflowType.AGENTIC:
        return "agentic_ppo" if estimator == AdvantageEstimator.GAE.value else "agentic"
    return "ppo" if estimator == AdvantageEstimator.GAE.value else "grpo"


def _remax_pipeline_name(workflow: WorkflowType, dynamic_sampling: bool) -> str:
    """ReMax needs a greedy baseline rollout before the sampled one: its own workflow, which
    has no dynamic sampling and no environment episodes."""
    if workflow is WorkflowType.DEFAULT and not dynamic_sampling:
        return "remax"
    what = "algorithm.filter_groups.enable=true" if dynamic_sampling else \
        f"algorithm.workflow_type={workflow.value}"
    raise ConfigError(
        f"algorithm.adv_estimator=remax runs the remax workflow (a greedy baseline rollout per "
        f"prompt, then the sampled rollout); it is not built with {what}: use "
        "workflow_type=DEFAULT without filter_groups, or a group estimator (grpo, rloo) "
        "there, or write the baseline nodes into a custom workflow (dag.custom_pipeline_fn "
        "with DAGWorker.generate_greedy_baseline and DAGWorker.compute_reward_baseline).")


def _as_task_graph(result: Any, origin: str) -> TaskGraph:
    if isinstance(result, Pipeline):
        result = result.build()
    if not isinstance(result, TaskGraph):
        raise PipelineError(f"{origin} returned {type(result).__name__}, expected a TaskGraph "
                            "(or a Pipeline)")
    result.validate_graph()
    return result


def load_pipeline(config: SiiRLArguments) -> TaskGraph:
    custom = config.dag.custom_pipeline_fn
    if custom:
        target = resolve_ref(str(custom), "dag.custom_pipeline_fn")
        return _as_task_graph(target.func(), f"dag.custom_pipeline_fn '{custom}'")
    workflow_path = config.dag.workflow_path
    if workflow_path:
        return load_workflow(str(workflow_path))
    named = config.dag.pipeline
    name = str(named) if named else builtin_pipeline_name(config)
    factory = load_plugin("siirl.pipelines", name,
                          what="dag.pipeline" if named else "algorithm.workflow_type")
    return _as_task_graph(factory(), f"pipeline '{name}'")
