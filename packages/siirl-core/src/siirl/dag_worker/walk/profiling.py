"""The torch profiler around chosen training steps or nodes (``profiler.*``, see
``siirl.params.profiler_args``), writing one Chrome trace per worker.

Steps are numbered as in metrics.jsonl (the first is 1). Only the workers in
``profiler.ranks`` (or all with ``all_ranks``) trace: a trace costs time and a file each.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator, Optional


class StepProfiler:
    """Decides what to trace on this worker and writes the traces."""

    def __init__(self, config: Any, rank: int):
        self.rank = int(rank)
        settings = config.profiler
        ranks = [int(r) for r in (settings.ranks or [])]
        self.on = settings.enable and (settings.all_ranks or self.rank in ranks)
        self.steps = {int(s) for s in (settings.profile_steps or [])}
        self.discrete = settings.discrete
        self.roles = {str(r) for r in (settings.roles or [])}
        run_dir = config.trainer.default_local_dir or "."
        self.root = Path(settings.save_path or Path(run_dir) / "profile")
        self.options = {"record_shapes": settings.record_shapes,
                        "profile_memory": settings.with_memory,
                        "with_stack": settings.with_stack,
                        "with_modules": settings.with_module}
        self.with_cpu = settings.with_cpu
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
