"""Start-up of the real command: from ``siirl-train`` to the end of the first training step.

    python tools/bench/startup.py [--runs 5] [--workers 1 2] [--out bench_startup.json] \
        [key=value ...]

Each run is a fresh process (``siirl-train trainer.total_training_steps=1``, otherwise the
main job's defaults, in a new run directory, so the built-in dataset is written again) whose
first step logs ``timing_s/to_first_step`` (from the command's start) and
``timing_s/setup`` (engines, data, resume). The table splits the time to the first step into

- start: interpreter, imports, configuration, plan (and, with 2 workers, Ray and the worker
  processes' own imports and process groups: everything before the set-up),
- set-up: ``timing_s/setup``,
- validation: the greedy validation before training (``trainer.val_before_train``),
- first step: ``timing_s/step`` of step 1,

and also shows the whole command (final validation, checkpoint and exit included), the CPU
time of a 1-worker command (all in one process tree here), and the 1-minute load average
when each run began (other processes on the machine slow the runs down). Medians over the
runs; ``--workers 2`` runs 2 CPU workers on a private local Ray cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from bench_info import write_result  # tools/bench is on sys.path when run as a script

COLUMNS = ("start", "setup", "validation", "first_step", "to_first_step", "command")


def _command(run_dir: str, workers: int, overrides: list) -> list:
    exe = os.path.join(os.path.dirname(sys.executable), "siirl-train")
    cmd = [exe, f"trainer.default_local_dir={run_dir}", "trainer.total_training_steps=1"]
    if workers > 1:  # a private local cluster: never join (and load) someone else's
        cmd += ["trainer.device=cpu", f"trainer.n_gpus_per_node={workers}",
                "trainer.ray_address=local", f"trainer.ray_temp_dir={run_dir}/ray"]
    return cmd + list(overrides)


def launch(cmd: list, timeout: float) -> tuple:
    """Run the command in its own session, so a timeout also ends the Ray processes it
    started; ``(exit code, stdout and stderr)``."""
    env = dict(os.environ, RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "disabled"),
               RAY_ADDRESS="")  # a private local cluster: no token files, no other cluster
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise TimeoutError(f"no result in {timeout:.0f} s") from None
    return proc.returncode, output


def one_run(workers: int, overrides: list, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="su", dir="/tmp") as run_dir:  # short: Ray sockets
        load = os.getloadavg()[0]
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        returncode, output = launch(_command(run_dir, workers, overrides), timeout)
        command = time.perf_counter() - start
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if returncode:
            raise RuntimeError(f"{workers} worker(s): exit {returncode}: "
                               f"{output.strip()[-800:]}")
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f if line.strip()]
    step = next(r for r in records if "timing_s/to_first_step" in r)
    val = next((r["timing_s/validation"] for r in records
                if r["step"] == 0 and "timing_s/validation" in r), 0.0)
    to_first = step["timing_s/to_first_step"]
    setup, first = step["timing_s/setup"], step["timing_s/step"]
    return {"start": to_first - setup - val - first, "setup": setup, "validation": val,
            "first_step": first, "to_first_step": to_first, "command": command,
            "command_cpu": (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime)
            if workers == 1 else None,
            "load_1min": load}


def summarise(runs: list) -> dict:
    out = {key: statistics.median(r[key] for r in runs) for key in COLUMNS + ("load_1min",)}
    cpu = [r["command_cpu"] for r in runs if r["command_cpu"] is not None]
    out["command_cpu"] = statistics.median(cpu) if cpu else None
    out["to_first_step_range"] = [min(r["to_first_step"] for r in runs),
                                  max(r["to_first_step"] for r in runs)]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", default="bench_startup.json")
    args, overrides = parser.parse_known_args(argv)
    result: dict = {"runs": args.runs, "overrides": overrides, "cpus": os.cpu_count(),
                    "python": platform.python_version(), "workers": {}}
    per_workers: dict = {n: [] for n in args.workers}
    for _ in range(args.runs):  # interleaved, so a change in machine load hits all alike
        for n in args.workers:
            per_workers[n].append(one_run(n, overrides, args.timeout))
    print(f"start-up of siirl-train to its first step (median of {args.runs} runs, seconds)")
    print(f"{'workers':>7}{'start':>8}{'set-up':>8}{'valid.':>8}{'step 1':>8}"
          f"{'to step 1':>11}{'(min-max)':>14}{'command':>9}{'cpu':>7}{'load':>6}")
    for n in args.workers:
        s = summarise(per_workers[n])
        result["workers"][str(n)] = {"median": s, "runs": per_workers[n]}
        low, high = s["to_first_step_range"]
        cpu = f"{s['command_cpu']:>7.1f}" if s["command_cpu"] is not None else f"{'-':>7}"
        print(f"{n:>7}{s['start']:>8.2f}{s['setup']:>8.2f}{s['validation']:>8.2f}"
              f"{s['first_step']:>8.2f}{s['to_first_step']:>11.2f}"
              f"{f'{low:.1f}-{high:.1f}':>14}{s['command']:>9.2f}{cpu}"
              f"{s['load_1min']:>6.1f}")
    write_result(result, args.out, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
