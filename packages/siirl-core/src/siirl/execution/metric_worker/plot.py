"""``siirl-plot RUN_DIR [RUN_DIR...]``: a run's training curves as one PNG.

Reads each run's ``metrics.jsonl`` and draws reward, validation score, response length,
KL, entropy and step time against the step (top row) and against training time (bottom
row: ``timing_s/wall``, the wall clock since training began, or the running sum of
``timing_s/step`` for runs that did not log it). One run: ``RUN_DIR/curves.png``. Several runs
are overlaid with a legend, written to each RUN_DIR, or once to ``--out FILE``. A metric no
run logged is left out; KL is left out when it is zero throughout (KL off).

Only matplotlib (Agg) is used: no torch, no engines.
"""

from __future__ import annotations

import argparse
import bisect
import io
import itertools
import json
import math
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

STEP_TIME = "timing_s/step"
WALL = "timing_s/wall"
# (title, candidate metrics: the first one with data is drawn, skip when all zero)
PANELS: Tuple[Tuple[str, Tuple[str, ...], bool], ...] = (
    ("reward", ("critic/score/mean",), False),
    ("validation score", ("val/score/mean",), False),
    ("response length", ("response_length/mean",), False),
    ("KL", ("actor/kl_loss", "actor/ppo_kl", "actor/reward_kl_penalty"), True),
    ("entropy", ("actor/entropy",), False),
    ("step time (s)", (STEP_TIME,), False),
)


class PlotError(Exception):
    """A user mistake: printed as one line, exit code 2."""


class Run:
    """One run's records: training steps and validations, the last record of a step wins
    (a resumed run may have logged a step twice)."""

    def __init__(self, directory: str, label: str):
        self.directory, self.label = directory, label
        path = os.path.join(directory, "metrics.jsonl")
        if not os.path.isfile(path):
            raise PlotError(f"{directory}: no metrics.jsonl (a run directory is what "
                            "trainer.default_local_dir names)")
        train: Dict[int, dict] = {}
        val: Dict[int, dict] = {}
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    step = int(record["step"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise PlotError(f"{path}:{number}: not a metrics record ({exc})") from exc
                target = train if STEP_TIME in record else val
                target.setdefault(step, {}).update(record)
        if not train and not val:
            raise PlotError(f"{path}: no records")
        self.train = [train[s] for s in sorted(train)]
        self.val = [val[s] for s in sorted(val)]
        # training time at the end of each step: the wall clock since training began
        # (timing_s/wall: validations and, asynchronously, waits included), or for runs
        # that did not log it the running sum of timing_s/step
        self._steps = [int(r["step"]) for r in self.train]
        walls = [_number(r.get(WALL)) for r in self.train]
        self._clock = walls if self.train and None not in walls else \
            list(itertools.accumulate(_number(r.get(STEP_TIME)) or 0.0 for r in self.train))

    def series(self, key: str, wall: bool) -> Tuple[List[float], List[float]]:
        xs, ys = [], []
        for record in self.val if key.startswith("val/") else self.train:
            value = _number(record.get(key))
            if value is None:
                continue
            step = int(record["step"])
            xs.append(self._time_at(step) if wall else step)
            ys.append(value)
        return xs, ys

    def duration(self) -> float:
        return self._clock[-1] if self._clock else 0.0

    def _time_at(self, step: int) -> float:
        done = bisect.bisect_right(self._steps, step)
        return self._clock[done - 1] if done else 0.0


def _number(value) -> Optional[float]:
    """A finite float, or None (absent, a string such as "nan", not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _smooth(values: Sequence[float]) -> List[float]:
    """Trailing moving average over about 2% of the points (noisy per-step metrics)."""
    window = max(1, len(values) // 50)
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def choose_panels(runs: Sequence[Run]) -> List[Tuple[str, str]]:
    """(title, metric) of every panel some run has data for."""
    chosen = []
    for title, candidates, skip_zero in PANELS:
        for key in candidates:
            values = [y for run in runs for y in run.series(key, False)[1]]
            if values and not (skip_zero and not any(values)):
                chosen.append((title, key))
                break
    return chosen


def draw(runs: Sequence[Run], out: str, dpi: int = 100) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    panels = choose_panels(runs)
    if not panels:
        raise PlotError("none of the plotted metrics is in "
                        + ", ".join(os.path.join(r.directory, "metrics.jsonl") for r in runs))
    fig = Figure(figsize=(3.2 * len(panels), 5.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, len(panels), squeeze=False)
    colors = [f"C{i % 10}" for i in range(len(runs))]
    minutes = max((run.duration() for run in runs), default=0.0) > 600
    for col, (title, key) in enumerate(panels):
        for row, wall in enumerate((False, True)):
            ax = axes[row][col]
            for run, color in zip(runs, colors, strict=True):
                xs, ys = run.series(key, wall)
                xs = [x / 60 for x in xs] if wall and minutes else xs
                if not xs:
                    continue
                if key.startswith("val/") or len(xs) < 50:
                    ax.plot(xs, ys, color=color, marker="o" if len(xs) < 50 else None,
                            markersize=3, linewidth=1.2)
                else:  # raw per-step values faint, their moving average on top
                    ax.plot(xs, ys, color=color, linewidth=0.6, alpha=0.25)
                    ax.plot(xs, _smooth(ys), color=color, linewidth=1.4)
            ax.set_title(f"{title}\n{key}" if row == 0 else title, fontsize=9)
            unit = "min" if minutes else "s"
            ax.set_xlabel(f"training time ({unit})" if wall else "step", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    if len(runs) > 1:
        handles = [Line2D([], [], color=c, label=r.label) for r, c in zip(runs, colors,
                                                                          strict=True)]
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(runs), 6),
                   fontsize=8)
    else:
        fig.suptitle(runs[0].directory, fontsize=9)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    _save(fig, out, dpi)


def _save(fig, out: str, dpi: int) -> None:
    """A PNG is saved with a 256-colour palette: a line plot looks the same, at half the
    bytes. Other formats (by extension: .svg, .pdf) as matplotlib writes them."""
    if not out.lower().endswith(".png"):
        fig.savefig(out, dpi=dpi)
        return
    from PIL import Image  # a dependency of matplotlib

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    buffer.seek(0)
    Image.open(buffer).convert("RGB").quantize(colors=256).save(out, optimize=True)


def _labels(directories: Sequence[str]) -> List[str]:
    names = [os.path.basename(os.path.normpath(d)) or d for d in directories]
    return names if len(set(names)) == len(names) else list(directories)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="siirl-plot", description="Draw the training curves of siiRL runs (from "
        "metrics.jsonl) into RUN_DIR/curves.png; several runs are overlaid.")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="a run's trainer.default_local_dir")
    parser.add_argument("--out", metavar="FILE",
                        help="write one PNG here instead of RUN_DIR/curves.png")
    parser.add_argument("--dpi", type=int, default=100, help="resolution (default 100)")
    args = parser.parse_args(argv)
    try:
        runs = [Run(d, label) for d, label in
                zip(args.run_dirs, _labels(args.run_dirs), strict=True)]
        outputs = [args.out] if args.out else \
            [os.path.join(d, "curves.png") for d in args.run_dirs]
        for out in outputs:
            draw(runs, out, args.dpi)
            print(out)
    except PlotError as exc:
        print(f"siirl-plot: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
