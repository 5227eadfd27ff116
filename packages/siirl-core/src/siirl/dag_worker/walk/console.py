"""What a run prints while it trains: one line per step and per validation, and a progress
bar when stderr is a terminal.

Redirected output (a log file, a pipe, a Ray worker) gets no bar at all, so it holds only
whole lines, never carriage returns. The step line leads with the workflow's headline
metric (the reward's mean; the environments' success rate and score for AGENTIC, success
rate and reward for EMBODIED, for multi-agent episodes too), then the metrics that are on
in this run: KL only when a KL term is configured, critic metrics when a critic runs,
DAPO's totals over all generation batches of the step; then the metrics of the user's own
nodes (a custom pipeline's). The validation line leads with the success rate where episodes
report one. A value that is not finite is left out.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Collection, Dict, List, Optional

from siirl.params.typed import to_typed

# Each workflow's headline, first: the one it logs is shown (DEFAULT: the reward's mean;
# AGENTIC: env/success_rate and env/score/mean; EMBODIED: env/success_rate and
# env/reward/mean; multi-agent episodes: multi_agent/...).
HEADLINE_KEYS = ("env/success_rate", "multi_agent/success_rate", "critic/score/mean",
                 "env/score/mean", "env/reward/mean", "multi_agent/env_score/mean")
# Shown in this order when the step logged them (a KL key only when KL is on).
STEP_KEYS = HEADLINE_KEYS + ("actor/pg_loss", "actor/kl_loss", "actor/reward_kl_penalty",
             "actor/entropy", "actor/grad_norm", "critic/vf_loss", "critic/values/mean",
             "dynamic_sampling/num_gen_batches", "dynamic_sampling/step_groups/kept",
             "response_length/mean", "perf/throughput", "timing_s/step")
# Shown as one field, ``kept=KEPT/TOTAL``.
OUT_OF = {"dynamic_sampling/step_groups/kept": "dynamic_sampling/step_groups/total"}
VAL_KEYS = ("val/success_rate", "val/greedy/success_rate", "val/sampled/success_rate",
            "val/score/mean", "val/response_length/mean", "timing_s/validation")
VAL_PREFIX = "val/"
# The user's own nodes' metrics shown at most (all of them are in metrics.jsonl).
CUSTOM_SHOWN = 8
KL_LOSS_KEYS = ("actor/kl_loss",)
KL_REWARD_KEYS = ("actor/reward_kl_penalty",)


def is_terminal(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def step_keys(config: Any) -> List[str]:
    """The step line's metrics for this run's configuration."""
    off = set()
    if not config.actor_rollout_ref.actor.use_kl_loss:
        off.update(KL_LOSS_KEYS)
    if not config.algorithm.use_kl_in_reward:
        off.update(KL_REWARD_KEYS)
    return [key for key in STEP_KEYS if key not in off]


def _shown(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def format_line(step: int, metrics: Dict[str, float], keys: List[str],
                custom: Collection[str] = ()) -> str:
    """``step N: key=value ...``; a validation record shows its own keys. ``custom``: the
    names the user's own nodes logged, shown after the built-in keys."""
    validation = any(key.startswith(VAL_PREFIX) for key in metrics)
    wanted = VAL_KEYS if validation else keys
    shown = []
    for key in wanted:
        if _shown(metrics.get(key)):
            total = metrics.get(OUT_OF.get(key, ""))
            shown.append(f"{key}={metrics[key]:.4g}" + (f"/{total:.4g}" if _shown(total)
                                                          else ""))
    if not validation:
        # siiRL's own names stay under the rules above (KL only when on), whoever logs them
        own = [k for k in sorted(custom) if k not in STEP_KEYS and k not in OUT_OF.values()
               and _shown(metrics.get(k))]
        shown += [f"{k}={metrics[k]:.4g}" for k in own[:CUSTOM_SHOWN]]
    if not shown:  # a workflow of unknown metrics: its first ones by name
        shown = [f"{k}={v:.4g}" for k, v in sorted(metrics.items())[:8] if _shown(v)]
    return f"step {step}: " + "  ".join(shown)


def write_line(line: str, stream: Any) -> None:
    """Print a whole line; above the progress bar when one is showing."""
    from tqdm import tqdm

    if getattr(tqdm, "_instances", None):
        tqdm.write(line, file=stream)
    else:
        stream.write(line + "\n")
    stream.flush()


class ConsoleLogger:
    """The ``console`` logger of ``trainer.logger``: one line per record on stdout."""

    def __init__(self, config: Any = None, stream: Any = None,
                 custom: Collection[str] = ()):
        self.stream = stream
        self.keys = step_keys(to_typed(config))  # None: the schema's defaults
        self.custom = custom  # read at every line: the user's nodes' names, as they log

    def log(self, step: int, metrics: Dict[str, float]) -> None:
        write_line(format_line(step, metrics, self.keys, self.custom),
                   self.stream or sys.stdout)

    def close(self) -> None:
        pass


class Progress:
    """The training progress bar: shown only when ``stream`` (stderr) is a terminal."""

    def __init__(self, total: int, initial: int, enabled: bool = True,
                 stream: Optional[Any] = None):
        stream = stream or sys.stderr
        self.bar = None
        if enabled and is_terminal(stream):
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="training", unit="step",
                            leave=False, dynamic_ncols=True, file=stream)

    def update(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:  # clear the bar so a final message stands alone
            self.bar.close()
            self.bar = None
