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
        agent_group: 0             # optional, multi-agent workflows (siiRL's MARFT files):
        config: {rollout.n: 1}     #   the agent's engine settings (under actor_rollout_ref)
        agent_options: {...}       #   see siirl.execution.dag.node.AGENT_OPTIONS

A top-level mapping that only exists to be reused through a YAML anchor
(``actor_1_config: &actor1_config {...}``, then ``config: *actor1_config``) is allowed.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Union

import yaml

from siirl.errors import PipelineError
from siirl.execution.dag.pipeline import Pipeline
from siirl.execution.dag.task_graph import TaskGraph

NODE_KEYS = ("node_id", "node_type", "node_role", "dependencies", "func",
             "only_forward_compute", "agent_group", "config", "agent_options")
TOP_KEYS = ("dag_id", "description", "nodes")


def _unknown(key: str, allowed, where: str) -> PipelineError:
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return PipelineError(f"{where}: unknown key '{key}'{hint}; allowed: {', '.join(allowed)}")


def _anchored_top_keys(text: str) -> set:
    """Top-level keys whose value carries a YAML anchor (``key: &name ...``)."""
    found, depth, key, expect_key = set(), 0, None, True
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        starts = isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent))
        ends = isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent))
        if depth == 1 and (starts or isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent))):
            if expect_key:
                key = getattr(event, "value", None)
            elif getattr(event, "anchor", None):
                found.add(key)
            expect_key = not expect_key
        depth += 1 if starts else -1 if ends else 0
    return found


def _found(ref: str, workflow: Path, where: str) -> str:
    """A file named relative to the working directory (siiRL's convention) or to the
    workflow file, made absolute (workers may run elsewhere); ``file.py:Name`` kept."""
    file, sep, name = str(ref).rpartition(":") if ":" in str(ref) else (str(ref), "", "")
    candidates = [Path(file)] if Path(file).is_absolute() else \
        [Path.cwd() / file, workflow.parent / file]
    for candidate in candidates:
        if candidate.is_file():
            return f"{candidate.resolve()}{sep}{name}"
    raise PipelineError(f"{where}: agent_options names '{file}', which does not exist (looked "
                        f"in {' and '.join(str(c.parent) for c in candidates)})")


def _with_paths(options: Any, workflow: Path, where: str) -> Any:
    if not isinstance(options, dict):
        return options
    options = dict(options)
    if options.get("process_path"):
        options["process_path"] = _found(options["process_path"], workflow, where)
    envs = options.get("env_path")
    if envs:
        envs = [envs] if isinstance(envs, str) else list(envs)
        options["env_path"] = [_found(ref, workflow, where) for ref in envs]
    return options


def load_workflow(path: Union[str, Path]) -> TaskGraph:
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"workflow file '{path}' does not exist")
    try:
        text = path.read_text()
        spec = yaml.safe_load(text)
        anchored = _anchored_top_keys(text)
    except yaml.YAMLError as exc:
        raise PipelineError(f"workflow file '{path}' is not valid YAML: {exc}") from exc
    if not isinstance(spec, dict) or not isinstance(spec.get("nodes"), list):
        raise PipelineError(f"workflow file '{path}' must be a mapping with a 'nodes:' list")
    for key in spec:
        if key not in TOP_KEYS and key not in anchored:
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
                              only_forward_compute=bool(entry.get("only_forward_compute")),
                              agent_group=entry.get("agent_group", 0),
                              config=entry.get("config"),
                              agent_options=_with_paths(entry.get("agent_options"), path,
                                                        where))
        except PipelineError as exc:
            raise PipelineError(f"{where}: {exc}") from exc
    try:
        return pipeline.build()
    except PipelineError as exc:
        raise PipelineError(f"workflow file '{path}': {exc}") from exc
