"""Load a workflow from YAML (the DistFlow guide's ``nodes:`` list) into a TaskGraph.

Format::

    dag_id: my_workflow            # optional, defaults to the file name
    description: ...               # optional
    nodes:
      - node_id: rollout_actor
        node_type: MODEL_INFERENCE # MODEL_INFERENCE / MODEL_TRAIN / COMPUTE / DATA_LOAD
        node_role: ROLLOUT         # ROLLOUT / ACTOR / CRITIC / REFERENCE / REWARD / ...
        dependencies: []
        func: "module:function"    # optional: defaults to the DAGWorker method for the role
        only_forward_compute: false  # optional
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Union

import yaml

from siirl.errors import PipelineError
from siirl.execution.dag.pipeline import Pipeline
from siirl.execution.dag.task_graph import TaskGraph

NODE_KEYS = ("node_id", "node_type", "node_role", "dependencies", "func",
             "only_forward_compute")
TOP_KEYS = ("dag_id", "description", "nodes")


def _unknown(key: str, allowed, where: str) -> PipelineError:
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return PipelineError(f"{where}: unknown key '{key}'{hint}; allowed: {', '.join(allowed)}")


def load_workflow(path: Union[str, Path]) -> TaskGraph:
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"workflow file '{path}' does not exist")
    try:
        spec = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise PipelineError(f"workflow file '{path}' is not valid YAML: {exc}") from exc
    if not isinstance(spec, dict) or not isinstance(spec.get("nodes"), list):
        raise PipelineError(f"workflow file '{path}' must be a mapping with a 'nodes:' list")
    for key in spec:
        if key not in TOP_KEYS:
            raise _unknown(key, TOP_KEYS, f"workflow file '{path}'")

    pipeline = Pipeline(str(spec.get("dag_id") or path.stem), str(spec.get("description", "")))
    for index, entry in enumerate(spec["nodes"]):
        where = f"workflow file '{path}', node #{index + 1}"
        if not isinstance(entry, dict) or "node_id" not in entry:
            raise PipelineError(f"{where}: each node must be a mapping with a 'node_id'")
        where = f"{where} ('{entry['node_id']}')"
        for key in entry:
            if key not in NODE_KEYS:
                raise _unknown(key, NODE_KEYS, where)
        for required in ("node_type", "node_role"):
            if required not in entry:
                raise PipelineError(f"{where}: missing '{required}'")
        try:
            pipeline.add_node(entry["node_id"], func=entry.get("func"),
                              deps=entry.get("dependencies") or [],
                              node_type=entry["node_type"], node_role=entry["node_role"],
                              only_forward_compute=bool(entry.get("only_forward_compute")))
        except PipelineError as exc:
            raise PipelineError(f"{where}: {exc}") from exc
    try:
        return pipeline.build()
    except PipelineError as exc:
        raise PipelineError(f"workflow file '{path}': {exc}") from exc
