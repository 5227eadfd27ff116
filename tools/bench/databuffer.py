"""DataBuffer throughput: peer-to-peer redistribution vs memcpy vs a centralized driver.

    python tools/bench/databuffer.py [--rows 4096] [--width 1024] [--workers 2 4] \
        [--repeat 5] [--out bench_databuffer.json] [--scaling [--scaling-steps 4]]

One run measures
- memcpy: one process cloning a payload the size of the whole batch;
- databuffer: N gloo worker processes, each holding rows/N rows, change layout from
  DP N to DP N/2 with tp 2 (N -> 1 when N = 2: both ranks read every row) with
  ``DataBuffer.redistribute``; no process sees more than the rows it sends or receives;
- centralized: the same change of layout the single-controller way in the same process
  group: every worker sends its rows to a driver (rank 0, which keeps its own), the driver
  concatenates, balances with the same plan, and sends every destination rank its rows.
  It uses the same raw-tensor transport, so it is a generous baseline (a Ray driver would
  also pickle the batch through its object store).
Throughput is batch bytes (all tensor fields, whole batch) / seconds of the slowest rank,
so the ratios are time ratios; ``wire_bytes`` is what actually crossed the transport
(headers included, the metadata all-gather not). ``--scaling`` additionally runs the main
job with 1 and 2 CPU workers at 16 prompts per worker and reports the scaling efficiency.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import torch

FIELDS = {"input_ids": torch.int64, "attention_mask": torch.int64, "old_log_probs": torch.float32}
GROUP = 4  # rows per uid, as with GRPO's n samples per prompt


def make_shard(rank: int, rows: int, width: int):
    from siirl.data_coordinator.protocol import make_batch

    gen = torch.Generator().manual_seed(rank)
    lengths = torch.randint(width // 8, width + 1, (rows,), generator=gen)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).to(torch.int64)
    tensors = {"input_ids": torch.randint(0, 32000, (rows, width), generator=gen) * mask,
               "attention_mask": mask,
               "old_log_probs": -torch.rand(rows, width, generator=gen)}
    return make_batch(tensors, {"uid": [f"{rank}-{i // GROUP}" for i in range(rows)]})


def batch_bytes(rows: int, width: int) -> int:
    return rows * width * sum(torch.empty((), dtype=d).element_size() for d in FIELDS.values())


def bench_memcpy(rows: int, width: int, repeat: int) -> dict:
    payload = [torch.ones(rows, width, dtype=d) for d in FIELDS.values()]
    times = []
    for _ in range(max(repeat, 5) + 1):  # the first clone also pays for page faults
        start = time.perf_counter()
        copies = [t.clone() for t in payload]
        times.append(time.perf_counter() - start)
        del copies
    seconds = statistics.median(times[1:])
    return {"seconds": seconds, "gbps": batch_bytes(rows, width) / seconds / 1e9}


def centralized(buf, shard, src, dst, method: str):
    """Gather every shard on rank 0, balance there, scatter every rank its rows."""
    import torch.distributed as dist

    from siirl.data_coordinator.data_buffer import _assemble, _schema, _source_meta, _take, plan
    from siirl.data_coordinator.transport import Piece, exchange

    me, driver = dist.get_rank(), 0
    schema = _schema(shard)
    own = _take(shard, list(range(shard.batch_size[0])), schema)
    senders = [src.source_rank(s) for s in range(src.dp_size) if src.source_rank(s) != driver]
    gathered = exchange({driver: own} if me != driver else {},
                        senders if me == driver else [], traffic=buf.traffic)
    sends: dict[int, Piece] = {}
    mine = None
    if me == driver:
        pieces = [own] + [gathered[r] for r in senders]
        whole = _assemble(pieces, schema, torch.device("cpu"))
        meta = _source_meta(whole, "attention_mask", "uid")
        the_plan = plan([meta], type(src)((driver,)), dst, method)
        for d, keys in enumerate(the_plan["dst_rows"]):
            piece = _take(whole, [i for _, i in keys], schema)
            sends.update({p: piece for p in dst.peers(d)})
        mine = sends.pop(driver, None)
    got = exchange(sends, [driver] if me != driver and dst.dp_rank(me) is not None else [],
                   traffic=buf.traffic)
    piece = mine if me == driver else got.get(driver)
    # Receivers end with a TensorDict, as with redistribute, so both pay for building it.
    return None if piece is None else _assemble([piece], schema, torch.device("cpu"))


def _worker(rank: int, world: int, port: int, args: dict, out_path: str) -> None:
    import torch.distributed as dist

    from siirl.data_coordinator.data_buffer import DataBuffer, Layout

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=300))
    src = Layout.data_parallel(world)
    dst = Layout.data_parallel(world, tp_size=2)
    shard = make_shard(rank, args["rows"] // world, args["width"])
    result = {}
    for name in ("databuffer", "centralized"):
        buf = DataBuffer()
        times, wire, driver = [], [], []
        for i in range(args["repeat"] + 1):  # call 0 sets up the gloo pairs: not timed
            sent, got = buf.bytes_sent, buf.bytes_received
            dist.barrier()
            start = time.perf_counter()
            if name == "databuffer":
                buf.redistribute(shard, src, dst)
            else:
                centralized(buf, shard, src, dst, "karmarkar_karp")
            stats = torch.tensor([time.perf_counter() - start, buf.bytes_sent - sent,
                                  buf.bytes_received - got], dtype=torch.float64)
            driver_bytes = float(stats[1] + stats[2]) if rank == 0 else 0.0
            dist.all_reduce(stats[:1], op=dist.ReduceOp.MAX)
            dist.all_reduce(stats[1:2], op=dist.ReduceOp.SUM)
            if i:
                times.append(float(stats[0]))
                wire.append(float(stats[1]))
                driver.append(driver_bytes)
        result[name] = {"seconds": statistics.median(times), "wire_bytes": wire[-1],
                        "driver_bytes": driver[-1] if name == "centralized" else 0.0}
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_workers(world: int, args: dict) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "result.json")
        mp.start_processes(_worker, args=(world, free_port(), args, path), nprocs=world,
                           start_method="spawn")
        with open(path) as f:
            return json.load(f)


def _launch(cmd: list, timeout: float) -> tuple[int, str]:
    """Run the job in its own session, so a timeout also ends the workers it started."""
    env = dict(os.environ)
    env.setdefault("RAY_AUTH_MODE", "disabled")  # a private local cluster: no token files
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env=env)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        raise TimeoutError(f"no result in {timeout:.0f} s; last output: "
                           f"{output[-400:].strip()}") from None
    return proc.returncode, output


def bench_scaling(steps: int, timeout: float) -> dict:
    """Main job at 1 and 2 CPU workers, 16 prompts (x rollout.n samples) per worker;
    steps/s skip step 1."""
    exe = os.path.join(os.path.dirname(sys.executable), "siirl-train")
    out: dict = {}
    for n in (1, 2):
        with tempfile.TemporaryDirectory() as run_dir:
            cmd = [exe, "trainer.device=cpu", "trainer.nnodes=1",
                   f"trainer.n_gpus_per_node={n}", f"data.train_batch_size={16 * n}",
                   f"actor_rollout_ref.actor.ppo_mini_batch_size={16 * n}",
                   f"trainer.total_training_steps={steps}", "trainer.test_freq=-1",
                   "trainer.val_before_train=false", "trainer.save_freq=-1",
                   "trainer.logger=[console]", f"trainer.default_local_dir={run_dir}",
                   # a private Ray cluster: never join (and load) one someone else runs
                   "trainer.ray_address=local", f"trainer.ray_temp_dir={run_dir}/ray"]
            try:
                returncode, output = _launch(cmd, timeout)
                if returncode:
                    errors = [ln for ln in output.splitlines() if "error" in ln.lower()]
                    raise RuntimeError(f"exit {returncode}: "
                                       f"{(errors[-1] if errors else output)[-600:].strip()}")
                with open(os.path.join(run_dir, "metrics.jsonl")) as f:
                    records = [json.loads(line) for line in f if line.strip()]
                times = [r["timing_s/step"] for r in records if "timing_s/step" in r][1:]
                if not times:
                    raise RuntimeError(f"metrics.jsonl has no step after the first ({steps=})")
                step_s = statistics.fmean(times)
                out[n] = {"steps_per_s": 1 / step_s, "prompts_per_s": 16 * n / step_s,
                          "steps_measured": len(times)}
            except Exception as err:  # report, do not crash the whole benchmark
                return {"error": f"{n} worker(s): {type(err).__name__}: {err}", **out}
    out["efficiency"] = out[2]["prompts_per_s"] / out[1]["prompts_per_s"] / 2
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default="bench_databuffer.json")
    parser.add_argument("--scaling", action="store_true", help="also run the main job at 1, 2")
    parser.add_argument("--scaling-steps", type=int, default=4)
    parser.add_argument("--scaling-timeout", type=float, default=600)
    args = parser.parse_args(argv)
    for n in args.workers:
        if n < 2 or n % 2 or args.rows % (n * GROUP):
            parser.error(f"--workers {n}: need an even count >= 2 with --rows divisible by "
                         f"{GROUP} * workers")
    size = batch_bytes(args.rows, args.width)
    result: dict = {"rows": args.rows, "width": args.width, "batch_bytes": size,
                    "memcpy": bench_memcpy(args.rows, args.width, args.repeat), "workers": {}}
    memcpy = result["memcpy"]["gbps"]
    print(f"batch: {args.rows} rows x {args.width} wide, {size / 1e6:.1f} MB\n")
    print(f"{'setup':<30}{'seconds':>10}{'GB/s':>8}{'wire MB':>10}{'driver MB':>11}"
          f"{'/memcpy':>9}{'/central':>10}")
    print(f"{'memcpy (clone, 1 process)':<30}{result['memcpy']['seconds']:>10.4f}{memcpy:>8.2f}")
    for n in args.workers:
        res = bench_workers(n, {"rows": args.rows, "width": args.width, "repeat": args.repeat})
        for entry in res.values():
            entry["gbps"] = size / entry["seconds"] / 1e9
        ours, central = res["databuffer"], res["centralized"]
        res["ratio_to_memcpy"] = ours["gbps"] / memcpy
        res["ratio_to_centralized"] = ours["gbps"] / central["gbps"]
        result["workers"][str(n)] = res
        shape = f"DP{n}->DP{n // 2}"
        for name, entry in (("databuffer", ours), ("centralized", central)):
            ratios = (f"{entry['gbps'] / memcpy:>9.3f}"
                      + (f"{res['ratio_to_centralized']:>10.2f}" if name == "databuffer" else ""))
            print(f"{f'{name} {shape} ({n} procs)':<30}{entry['seconds']:>10.4f}"
                  f"{entry['gbps']:>8.2f}{entry['wire_bytes'] / 1e6:>10.1f}"
                  f"{entry['driver_bytes'] / 1e6:>11.1f}{ratios}")
    if args.scaling:
        result["scaling"] = scaling = bench_scaling(args.scaling_steps, args.scaling_timeout)
        print("\nmain job, 16 prompts x rollout.n per CPU worker:")
        for n in (1, 2):
            if n in scaling:
                s = scaling[n]
                print(f"  {n} worker(s): {s['steps_per_s']:.3f} steps/s, "
                      f"{s['prompts_per_s']:.2f} prompts/s")
        if "error" in scaling:
            print(f"  scaling run failed: {scaling['error']}")
        else:
            print(f"  scaling efficiency (2 vs 1): {scaling['efficiency']:.2f}")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
