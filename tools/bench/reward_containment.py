"""What containing a user reward function costs per step.

    python tools/bench/reward_containment.py [--prompts 32] [--n 8] [--repeat 20] \
        [--out bench_reward_containment.json]

The main job's reward step (``--prompts`` x ``--n`` samples of the built-in arithmetic
task) scored by the same user function four ways: called in this process (what the
managers did before they contained user code), and by the ``naive``, ``parallel`` and
``batch`` managers, which run it in persistent worker processes. Times are the median
of ``--repeat`` calls of ``compute_reward`` after one warm-up call (which starts the
worker processes), so they are the per-step cost; ``overhead_ms`` is the difference to
the in-process call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
from bench_info import write_result  # tools/bench is on sys.path when run as a script

ROW_FN = '''
from siirl.engine.reward_score.arithmetic import compute_score as rule

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return rule(solution_str, ground_truth, extra_info)

def batch_score(data_sources, solution_strs, ground_truths, extra_infos):
    return [rule(s, g) for s, g in zip(solution_strs, ground_truths)]
'''


class _Tokenizer:
    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(chr(i) for i in row if i) for row in rows]


def _batch(rows: int, width: int = 8):
    from siirl.data_coordinator.protocol import make_batch

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(ord("0"), ord("9") + 1, (rows, width), generator=gen)
    mask = torch.ones(rows, width)
    return make_batch({"responses": ids, "response_mask": mask},
                      {"data_source": ["arithmetic"] * rows,
                       "ground_truth": [str(i % 100) for i in range(rows)],
                       "extra_info": [{"index": i} for i in range(rows)]})


def _time(manager, rows: int, repeat: int) -> float:
    manager.compute_reward(_batch(rows))  # warm-up: starts the worker processes
    times = []
    for _ in range(repeat):
        batch = _batch(rows)
        start = time.perf_counter()
        manager.compute_reward(batch)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", default="bench_reward_containment.json")
    args = parser.parse_args()
    from siirl.engine.reward_manager import get_reward_manager_cls, load_custom_function

    rows = args.prompts * args.n
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "reward.py")
        with open(path, "w") as handle:
            handle.write(ROW_FN)
        fn = {"path": path, "name": "compute_score"}
        setups = {
            "in process": ("naive", {}, {"compute_score": load_custom_function(path)}),
            "naive": ("naive", {"custom_reward_function": fn}, {}),
            "parallel": ("parallel", {"custom_reward_function": fn}, {}),
            "batch": ("batch", {"custom_reward_function": {**fn, "name": "batch_score"}}, {}),
        }
        results = {}
        for label, (name, config, kwargs) in setups.items():
            manager = get_reward_manager_cls(name)(config=config, tokenizer=_Tokenizer(),
                                                   **kwargs)
            results[label] = _time(manager, rows, args.repeat)
            manager.close()
    base = results["in process"]
    print(f"reward step of {rows} samples ({args.prompts} prompts x {args.n}), median of "
          f"{args.repeat}")
    print(f"{'how':<12} {'ms/step':>9} {'overhead_ms':>12}")
    table = []
    for label, seconds in results.items():
        print(f"{label:<12} {seconds * 1e3:>9.2f} {(seconds - base) * 1e3:>12.2f}")
        table.append({"how": label, "ms_per_step": seconds * 1e3,
                      "overhead_ms": (seconds - base) * 1e3})
    write_result({"samples": rows, "results": table}, args.out, sys.argv[1:])


if __name__ == "__main__":
    main()
