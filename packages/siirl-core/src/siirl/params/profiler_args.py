"""The torch profiler around chosen steps (siiRL's ``profiler.*`` keys; verl's
``trainer.profile_steps`` turns it on for those steps).

Traces are Chrome trace files (chrome://tracing, Perfetto), one per worker:
``<save_path>/step_<N>/rank<R>.json`` around the whole step, or with ``discrete``
``<save_path>/step_<N>/<node>_rank<R>.json`` around each chosen node. ``level``,
``with_npu`` and ``analysis`` are Ascend NPU settings (torch_npu's profiler), which this
release does not run.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ProfilerArguments:
    """siiRL's profiler settings: which steps, workers and nodes to trace, and what to record."""

    enable: bool = field(default=False, metadata={"help": "Profile profile_steps with the "
                                                          "torch profiler."})
    save_path: str | None = field(
        default=None, metadata={"help": "Folder of the traces (null: <trainer.default_local_dir>"
                                        "/profile)."})
    level: str = field(default="level1", metadata={"help": "Ascend NPU collection level (not "
                                                           "used here)."})
    with_memory: bool = field(default=False, metadata={"help": "Record tensor allocations."})
    record_shapes: bool = field(default=False, metadata={"help": "Record operator input "
                                                                 "shapes."})
    with_npu: bool = field(default=True, metadata={"help": "Ascend NPU device-side data (not "
                                                           "used here; CUDA is traced when "
                                                           "present)."})
    with_cpu: bool = field(default=False, metadata={"help": "Host-side operators when a GPU "
                                                            "is traced (always on a CPU run)."})
    with_module: bool = field(default=False, metadata={"help": "Record the Python module "
                                                               "hierarchy."})
    with_stack: bool = field(default=False, metadata={"help": "Record call stacks of "
                                                              "operators."})
    analysis: bool = field(default=True, metadata={"help": "Ascend NPU automatic parsing (not "
                                                           "used here)."})
    discrete: bool = field(default=False, metadata={"help": "One trace per chosen node "
                                                            "(roles) instead of one per step."})
    roles: list[str] = field(
        default_factory=lambda: ["generate", "compute_reward"],
        metadata={"help": "With discrete: the nodes to trace, by node id or by the worker "
                          "method they run (generate, compute_reward, compute_old_log_prob, "
                          "compute_ref_log_prob, compute_value, compute_advantage, "
                          "train_critic, train_actor)."})
    all_ranks: bool = field(default=False, metadata={"help": "Profile every worker."})
    ranks: list[int] = field(default_factory=lambda: [0],
                             metadata={"help": "The workers to profile (global ranks)."})
    profile_steps: list[int] = field(default_factory=lambda: [1],
                                     metadata={"help": "The training steps to profile (the "
                                                       "first step is 1, as in "
                                                       "metrics.jsonl)."})
