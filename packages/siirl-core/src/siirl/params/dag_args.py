"""Schema of the siiRL-specific ``dag`` group (how the training workflow graph is built)."""

from dataclasses import dataclass, field


@dataclass
class DagArguments:
    """Workflow DAG: custom pipeline function or YAML workflow file, profiling."""

    custom_pipeline_fn: str | None = field(
        default=None,
        metadata={"help": "'module:function' returning a TaskGraph; overrides workflow_type."},
    )
    workflow_path: str | None = field(
        default=None, metadata={"help": "YAML workflow file describing the TaskGraph."}
    )
    pipeline: str | None = field(
        default=None,
        metadata={"help": "Name of a workflow registered in the 'siirl.pipelines' entry-point "
                          "group (after custom_pipeline_fn and workflow_path)."},
    )
    enable_perf: bool = False
