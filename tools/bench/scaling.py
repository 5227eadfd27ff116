"""Multi-worker scaling of the main job: 1 -> 2 CPU workers at a fixed batch per worker.

    python tools/bench/scaling.py [--rounds 3] [--steps 8] [--prompts-per-worker 32] \
        [--out bench_scaling.json] [key=value ...]

Each round runs the main job (``siirl-train``, one torch thread per worker, no validation
or checkpoints) with 1 worker and with 2 (a private local Ray cluster) in both data-parallel
layouts of the fsdp engine: ``shard`` (the default, ``fsdp_size=-1``: FSDP2 shards every
layer over the workers) and ``replicate`` (``fsdp_size=1`` for actor, reference and critic:
every worker holds the whole model, one gradient all-reduce per update). Every job trains on
``--prompts-per-worker`` prompts per worker (default: the main job's 32) and reports the
median ``timing_s/step`` after two warm-up steps. With the batch per worker fixed, perfect
scaling keeps the step time, so a layout's efficiency is ``step(1) / step(2)``.

On a shared machine two workers may not get two cores. Each round therefore also runs a
probe: the same small torch workload in one process, then in two at once; its efficiency
(``alone / together``) is what the machine gave two processes just then, and
``efficiency / probe`` estimates the job's own overhead. A second estimate that contention
does not move: the CPU time one step costs each worker (read from ``/proc`` each time a
step is logged), whose ratio ``CPU(1) / CPU(2)`` is the efficiency two idle cores would
give at most. Per node, ``2w/1w`` shows where time went: nodes without communication
(reward, advantages) slow down only by contention; a sharded rollout gathers the weights
once and the update waits for the data-parallel collectives. Also reported: the 2-worker
start-up (``timing_s/to_first_step``) and the bytes the DataBuffer moved.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also when loaded by path
from bench_info import write_result  # noqa: E402

WARMUP_STEPS = 2
# the 2-worker layouts compared with one worker: extra overrides of each
LAYOUTS = {
    "shard": [],
    "replicate": [f"{prefix}.fsdp_config.fsdp_size=1" for prefix in
                  ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic.model")],
}
PROBE = """
import sys, time, torch
torch.set_num_threads(1)
layer = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.SiLU(), torch.nn.Linear(256, 64))
x = torch.randn(256, 16, 64)
for _ in range(10):
    layer(x).sum().backward()
time.sleep(max(0.0, float(sys.argv[1]) - time.time()))  # start together
start = time.perf_counter()
for _ in range(int(sys.argv[2])):
    layer(x).sum().backward()
print(time.perf_counter() - start)
"""


def probe(iterations: int = 150) -> dict:
    """Seconds of a fixed single-thread torch workload alone and as two processes at once."""
    def launch(count: int) -> list:
        start_at = time.time() + 4.0  # after the imports of both processes
        procs = [subprocess.Popen([sys.executable, "-c", PROBE, str(start_at), str(iterations)],
                                  stdout=subprocess.PIPE, text=True) for _ in range(count)]
        return [float(p.communicate()[0]) for p in procs]

    alone = launch(1)[0]
    together = statistics.fmean(launch(2))
    return {"alone_s": alone, "together_s": together, "efficiency": alone / together}


def cpu_seconds(pid: int) -> Optional[float]:
    """CPU time (user + system) a live process has used so far (Linux ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class StepCpu:
    """Samples the workers' CPU time each time ``metrics.jsonl`` gains a step line, so the
    CPU one step costs each worker is known whatever else runs on the machine."""

    def __init__(self, run_dir: str, workers: int):
        self.run_dir, self.workers = run_dir, workers
        self.at_line: dict = {}  # lines in metrics.jsonl -> CPU seconds per worker

    def _pids(self, driver: int) -> list:
        if self.workers == 1:
            return [driver]  # one worker runs in the command's own process
        try:
            with open(os.path.join(self.run_dir, "workers.json")) as f:
                return [w["pid"] for w in json.load(f)]
        except (OSError, ValueError):
            return []

    def sample(self, driver: int) -> None:
        try:
            with open(os.path.join(self.run_dir, "metrics.jsonl")) as f:
                lines = sum(1 for _ in f)
        except OSError:
            return
        pids = self._pids(driver)
        if lines not in self.at_line and pids:
            cpu = [cpu_seconds(pid) for pid in pids]
            if None not in cpu:
                self.at_line[lines] = cpu

    def per_step(self, first: int, last: int) -> Optional[float]:
        """Mean over workers of the CPU seconds per step from step ``first`` to ``last``."""
        if first not in self.at_line or last not in self.at_line or last <= first:
            return None
        spent = [b - a for a, b in zip(self.at_line[first], self.at_line[last], strict=True)]
        return statistics.fmean(spent) / (last - first)


def launch(cmd: list, timeout: float, log_path: str, watch: Any = None) -> int:
    """Run a job in its own session, so a timeout also ends the Ray processes it started;
    output to ``log_path``; ``watch(pid)`` is called every 20 ms while it runs."""
    env = dict(os.environ, RAY_AUTH_MODE=os.environ.get("RAY_AUTH_MODE", "disabled"),
               RAY_ADDRESS="")  # a private local cluster: no token files, no other cluster
    deadline = time.monotonic() + timeout
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
        while proc.poll() is None:
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise TimeoutError(f"no result in {timeout:.0f} s")
            if watch is not None:
                watch(proc.pid)
            time.sleep(0.02)
    return proc.returncode


def run_job(workers: int, steps: int, per_worker: int, overrides: list,
            timeout: float) -> dict:
    exe = os.path.join(os.path.dirname(sys.executable), "siirl-train")
    with tempfile.TemporaryDirectory(prefix="sc", dir="/tmp") as run_dir:  # short: Ray sockets
        cmd = [exe, "trainer.device=cpu", "trainer.nnodes=1", "trainer.cpu_threads=1",
               f"trainer.n_gpus_per_node={workers}",
               f"data.train_batch_size={per_worker * workers}",
               f"actor_rollout_ref.actor.ppo_mini_batch_size={per_worker * workers}",
               f"trainer.total_training_steps={steps}", "trainer.test_freq=-1",
               "trainer.val_before_train=false", "trainer.save_freq=-1", "trainer.logger=[]",
               f"trainer.default_local_dir={run_dir}",
               # a private Ray cluster: never join (and load) one someone else runs
               "trainer.ray_address=local", f"trainer.ray_temp_dir={run_dir}/ray",
               *overrides]
        cpu = StepCpu(run_dir, workers)
        log_path = os.path.join(run_dir, "output.log")
        returncode = launch(cmd, timeout, log_path, watch=cpu.sample)
        if returncode:
            with open(log_path) as f:
                raise RuntimeError(f"{workers} worker(s): exit {returncode}: "
                                   f"{f.read().strip()[-800:]}")
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f if "timing_s/step" in line]
    measured = records[WARMUP_STEPS:] or records
    nodes = sorted({k for r in measured for k in r if k.startswith("timing_s/")
                    and k not in ("timing_s/to_first_step", "timing_s/setup")})
    return {"step_s": statistics.median(r["timing_s/step"] for r in measured),
            "cpu_per_step_s": cpu.per_step(len(records) - len(measured), len(records)),
            "nodes": {k.split("/", 1)[1]: statistics.median(r.get(k, 0.0) for r in measured)
                      for k in nodes},
            "to_first_step_s": records[0].get("timing_s/to_first_step"),
            "databuffer_bytes": sum(v for r in measured for k, v in r.items()
                                    if k.startswith("databuffer/") and k.endswith("bytes_sent")),
            "steps_measured": len(measured)}


def _median_or_none(values: list) -> Optional[float]:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _layout_summary(rounds: list, layout: str, med) -> dict:
    nodes = sorted(set(rounds[0]["1"]["nodes"]) | set(rounds[0][layout]["nodes"]))
    return {
        "step_s": med(lambda r: r[layout]["step_s"]),
        "efficiency": med(lambda r: r["efficiency"][layout]),
        "relative_to_probe": med(lambda r: r["efficiency"][layout] / r["probe"]["efficiency"]),
        "cpu_per_step_s": _median_or_none([r[layout]["cpu_per_step_s"] for r in rounds]),
        "cpu_efficiency": _median_or_none([r["cpu_efficiency"][layout] for r in rounds]),
        "to_first_step_s": med(lambda r: r[layout]["to_first_step_s"]),
        "databuffer_bytes_per_step": med(lambda r: r[layout]["databuffer_bytes"]
                                         / r[layout]["steps_measured"]),
        "nodes": {k: med(lambda r, k=k: r[layout]["nodes"].get(k, 0.0)) for k in nodes},
    }


def print_table(summary: dict, args: Any) -> None:
    layouts = summary["layouts"]
    print(f"main job, {args.prompts_per_worker} prompts per CPU worker, one torch thread each "
          f"(median of {args.rounds} rounds)")
    header = "".join(f"{'2w ' + name:>14}{'2w/1w':>7}" for name in layouts)
    print(f"{'':<26}{'1 worker':>10}{header}")
    nodes = summary["nodes_1"]
    for key in sorted(set(nodes).union(*(lay["nodes"] for lay in layouts.values()))):
        one = nodes.get(key, 0.0)
        row = f"{key + ' (s)':<26}{one:>10.4f}"
        for lay in layouts.values():
            two = lay["nodes"].get(key, 0.0)
            ratio = two / one if one > 1e-4 else float("nan")
            row += f"{two:>14.4f}{ratio:>7.2f}"
        print(row)
    cpu1 = summary["cpu_per_step_s_1"]
    if cpu1 and all(lay["cpu_per_step_s"] for lay in layouts.values()):
        print(f"{'CPU s/step per worker':<26}{cpu1:>10.4f}" + "".join(
            f"{lay['cpu_per_step_s']:>14.4f}{lay['cpu_per_step_s'] / cpu1:>7.2f}"
            for lay in layouts.values()))
    print(f"\nprobe efficiency (the machine):  {summary['probe_efficiency']:.2f}")
    for name, lay in layouts.items():
        cpu = (f", CPU {lay['cpu_efficiency']:.2f}" if lay["cpu_efficiency"] is not None
               else "")
        print(f"{name:<10} efficiency {lay['efficiency']:.2f} (/ probe "
              f"{lay['relative_to_probe']:.2f}{cpu}); start-up to step 1 "
              f"{lay['to_first_step_s']:.1f} s; DataBuffer bytes/step "
              f"{lay['databuffer_bytes_per_step']:.0f}")


def summarize(rounds: list) -> dict:
    """Medians over rounds: the 1-worker step and, per layout, the 2-worker figures."""
    med = lambda get: statistics.median(get(r) for r in rounds)  # noqa: E731
    return {
        "step_s_1": med(lambda r: r["1"]["step_s"]),
        "cpu_per_step_s_1": _median_or_none([r["1"]["cpu_per_step_s"] for r in rounds]),
        "nodes_1": {k: med(lambda r, k=k: r["1"]["nodes"].get(k, 0.0))
                    for k in rounds[0]["1"]["nodes"]},
        "probe_efficiency": med(lambda r: r["probe"]["efficiency"]),
        "layouts": {k: _layout_summary(rounds, k, med) for k in LAYOUTS},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts-per-worker", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", default="bench_scaling.json")
    args, overrides = parser.parse_known_args(argv)
    rounds = []
    for _ in range(args.rounds):  # interleaved, so load changes hit every part alike
        entry = {"probe": probe(),
                 "1": run_job(1, args.steps, args.prompts_per_worker, overrides, args.timeout)}
        for layout, extra in LAYOUTS.items():
            entry[layout] = run_job(2, args.steps, args.prompts_per_worker,
                                    overrides + extra, args.timeout)
        entry["efficiency"] = {k: entry["1"]["step_s"] / entry[k]["step_s"] for k in LAYOUTS}
        cpu1 = entry["1"]["cpu_per_step_s"]
        entry["cpu_efficiency"] = {k: cpu1 / entry[k]["cpu_per_step_s"]
                                   if cpu1 and entry[k]["cpu_per_step_s"] else None
                                   for k in LAYOUTS}
        rounds.append(entry)
    summary = summarize(rounds)
    print_table(summary, args)
    write_result({"args": vars(args), "overrides": overrides, "layouts": LAYOUTS,
                  "summary": summary, "rounds": rounds}, args.out, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
