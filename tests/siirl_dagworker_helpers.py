"""Node functions the DAGWorker tests reference as "siirl_dagworker_helpers:<name>".

Every call appends to ``CALLS`` so a test can see what a node received.
"""

import torch

from siirl.dag_worker.dagworker import DAGWorker
from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator.protocol import make_batch
from siirl.errors import DataError

CALLS = []


def source(batch, config=None):
    """Entry node: makes a batch when given none."""
    CALLS.append(("source", batch))
    if batch is None:
        batch = make_batch({"x": torch.arange(4, dtype=torch.float32)})
    return NodeOutput(batch=batch)


def _with(batch, **fields):
    out = batch.clone()
    for key, value in fields.items():
        out.set(key, value)
    return out


def add_one(batch, config=None):
    return NodeOutput(batch=_with(batch, x=batch["x"] + 1))


def times_two(batch, config=None):
    return NodeOutput(batch=_with(batch, x=batch["x"] * 2))


def left(batch, config=None):
    rows = batch.batch_size[0]
    return NodeOutput(batch=_with(batch, shared=torch.full((rows,), 1.0),
                                  left_only=torch.full((rows,), 10.0)))


def right(batch, config=None):
    rows = batch.batch_size[0]
    return NodeOutput(batch=_with(batch, shared=torch.full((rows,), 2.0),
                                  right_only=torch.full((rows,), 20.0)))


def shorter(batch, config=None):
    return NodeOutput(batch=batch[:2])


def record(batch, config=None):
    CALLS.append(("record", batch))
    return NodeOutput(batch=batch)


def passthrough(batch, config=None):
    return NodeOutput(batch=None, metrics={"pass/count": 1})


def tensor_metrics(batch, config=None):
    return NodeOutput(batch=batch, metrics={
        "m/scalar": torch.tensor(2.5),
        "m/vector": torch.tensor([1.0, 3.0]),
        "m/int": 3,
        "m/list": [1, 2, 3],
        "m/bool": torch.tensor(True),
    })


def not_node_output(batch, config=None):
    return {"batch": batch}


def boom(batch, config=None):
    raise ValueError("kaboom 42")


def data_error(batch, config=None):
    raise DataError("bad row 7")


def only_config(batch, config=None):
    CALLS.append(("config", config))
    return NodeOutput(batch=batch)


def wants_node(batch, config=None, node=None):
    CALLS.append(("node", node))
    return NodeOutput(batch=batch)


def wants_worker(batch, config=None, worker=None):
    CALLS.append(("worker", worker))
    return NodeOutput(batch=batch)


def takes_kwargs(batch, config=None, **kwargs):
    CALLS.append(("kwargs", dict(kwargs)))
    return NodeOutput(batch=batch)


class StaticOps:
    @staticmethod
    def inc(batch, config=None):
        return NodeOutput(batch=_with(batch, x=batch["x"] + 100))


class Stateful:
    """Instantiated once per worker by the executor; counts its constructions."""

    instances = 0

    def __init__(self):
        type(self).instances += 1
        self.calls = 0

    def count(self, batch, config=None):
        self.calls += 1
        CALLS.append(("stateful", self, self.calls))
        return NodeOutput(batch=batch)

    def count_again(self, batch, config=None):
        return self.count(batch, config)


class NeedsArgs:
    def __init__(self, required):
        self.required = required

    def run(self, batch, config=None):
        return NodeOutput(batch=batch)


class MyWorker(DAGWorker):
    """A DAGWorker subclass whose method runs bound to whichever worker executes it."""

    def double(self, batch, config=None):
        CALLS.append(("self", self))
        return NodeOutput(batch=_with(batch, x=batch["x"] * 2))
