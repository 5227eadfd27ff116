"""How many workers the job has: the number the planner splits the DAG over.

Starting them (in this process, or as Ray actors) needs the DAGWorker, which sits above
this layer, so it lives in ``siirl.launch`` (``siirl.launch.job.start_workers``).
"""

from __future__ import annotations

from typing import Any

from siirl.errors import ConfigError
from siirl.execution.config_select import select


def num_workers(config: Any) -> int:
    nodes = int(select(config, "trainer.nnodes", 1))
    per_node = int(select(config, "trainer.n_gpus_per_node", 1))
    if nodes < 1 or per_node < 1:
        raise ConfigError(f"trainer.nnodes={nodes} and trainer.n_gpus_per_node={per_node} "
                          "must both be at least 1")
    return nodes * per_node
