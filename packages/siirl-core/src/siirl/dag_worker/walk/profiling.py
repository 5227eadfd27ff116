"""The torch profiler around chosen training steps or nodes (``profiler.*``, see
``siirl.params.profiler_args``), writing one Chrome trace per worker.

Steps are numbered as in metrics.jsonl (the first is 1). Only the workers in
``profiler.ranks`` (or all with ``all_ranks``) trace: a trace costs time and a file each.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Optional

from siirl.execution.config_select import select


class StepProfiler:
    """Decides what to trace on this worker and writes the traces."""

    def __init__(self, config: Any, rank: int):
        def get(key: str, default: Any = None) -> Any:
            return select(config, f"profiler.{key}", default)

        self.rank = int(rank)
        ranks = [int(r) for r in (get("ranks") or [])]
        self.on = bool(get("enable", False)) and (bool(get("all_ranks", False))
                                                   or self.rank in ranks)
        self.steps = {int(s) for s in (get("profile_steps") or [])}
        self.discrete = bool(get("discrete", False))
        self.roles = {str(r) for r in (get("roles") or [])}
        run_dir = str(select(config, "trainer.default_local_dir", ".") or ".")
        self.root = Path(get("save_path") or Path(run_dir) / "profile")
        self.options = {"record_shapes": bool(get("record_shapes", False)),
                        "profile_memory": bool(get("with_memory", False)),
                        "with_stack": bool(get("with_stack", False)),
                        "with_modules": bool(get("with_module", False))}
        self.with_cpu = bool(get("with_cpu", False))
        self.written: list[Path] = []
        self.current: Optional[int] = None  # the training step running now

    def _activities(self) -> list:
        import torch
        from torch.profiler import ProfilerActivity

        if torch.cuda.is_available():  # the device, and the host when asked for
            return [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if self.with_cpu else [])
        return [ProfilerActivity.CPU]

    @contextlib.contextmanager
    def _trace(self, path: Path) -> Iterator[None]:
        from torch.profiler import profile

        with profile(activities=self._activities(), **self.options) as prof:
            yield
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        self.written.append(path)

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Around a whole training step: traced unless ``discrete``; its nodes may be
        traced (``node``) only inside it, so validation's nodes never are."""
        self.current = step
        try:
            if not self.on or self.discrete or step not in self.steps:
                yield
            else:
                with self._trace(self.root / f"step_{step}" / f"rank{self.rank}.json"):
                    yield
        finally:
            self.current = None

    def node(self, node_id: str, method: Optional[str]) -> contextlib.AbstractContextManager:
        """Around one node of a profiled step with ``discrete``, when its id or the worker
        method it runs is in ``roles``."""
        step = self.current
        if not (self.on and self.discrete and step in self.steps
                and (node_id in self.roles or method in self.roles)):
            return contextlib.nullcontext()
        return self._trace(self.root / f"step_{step}" / f"{node_id}_rank{self.rank}.json")
