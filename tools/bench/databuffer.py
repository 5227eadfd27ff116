"""DataBuffer throughput: peer-to-peer redistribution vs memcpy vs a centralized driver.

    python tools/bench/databuffer.py [--rows 4096] [--width 1024] [--workers 2 4] \
        [--repeat 5] [--out bench_databuffer.json] [--scaling [--scaling-steps 4]]

One run measures
- memcpy: one process cloning a payload the size of the whole batch;
- databuffer: N gloo worker processes, each holding rows/N rows, change layout from
  DP N to DP N/2 with tp 2 (N -> 1 when N = 2: both ranks read every row) with
  ``DataBuffer.redistribute``; no process sees more than the rows it sends or receives.
  The workers share one node, so rows go through shared memory (path ``shm``);
- databuffer-gloo: the same with ``shared_memory=False``, every row over gloo (the route
  ranks on different nodes take);
- centralized: the same change of layout the single-controller way in the same process
  group: every worker sends its rows to a driver (rank 0, which keeps its own), the driver
  concatenates, balances with the same plan, and sends every destination rank its rows.
  It uses the same raw-tensor transport, so it is a generous baseline (a Ray driver would
  also pickle the batch through its object store).
Throughput is batch bytes (all tensor fields, whole batch) / seconds of the slowest rank,
so the ratios are time ratios; ``wire_bytes`` is what actually crossed the transport
(headers and shared-memory notes included, the metadata all-gather not), ``shm_bytes``
what senders wrote to their shared-memory staging, ``meta_bytes`` the metadata records
all ranks all-gathered, ``driver_bytes`` what went through a driver process (none for the
DataBuffer: it has no driver), and ``path`` which route the rows took (shm, gloo or
mixed). ``--scaling`` additionally runs the main job with 1 and 2 CPU workers at 16
prompts per worker and reports the scaling efficiency (through tools/bench/scaling.py, which
gives the full report).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch
from bench_info import write_result  # tools/bench is on sys.path when run as a script

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
    counters = ("bytes_sent", "shared_bytes", "meta_bytes", "rows_sent", "shared_rows")
    for name in ("databuffer", "databuffer-gloo", "centralized"):
        buf = DataBuffer(shared_memory=name == "databuffer")
        times, sums, driver = [], [], []
        # call 0 sets up the gloo pairs and maps the shared-memory files: not timed
        for i in range(args["repeat"] + 1):
            before = [getattr(buf.traffic, c) for c in counters] + [buf.bytes_received]
            dist.barrier()
            start = time.perf_counter()
            if name == "centralized":
                centralized(buf, shard, src, dst, "karmarkar_karp")
            else:
                out = buf.redistribute(shard, src, dst)
                del out  # as the centralized baseline's result: freed before the next call
            seconds = time.perf_counter() - start
            delta = [getattr(buf.traffic, c) - b for c, b in zip(counters, before, strict=False)]
            received = buf.bytes_received - before[-1]
            # rank 0 is the driver of the centralized baseline: all it moves
            driver_bytes = delta[0] + received if rank == 0 and name == "centralized" else 0
            stats = torch.tensor([seconds, driver_bytes, *delta], dtype=torch.float64)
            dist.all_reduce(stats[:1], op=dist.ReduceOp.MAX)
            dist.all_reduce(stats[1:], op=dist.ReduceOp.SUM)
            if i:
                times.append(float(stats[0]))
                driver.append(float(stats[1]))
                sums.append(dict(zip(counters, stats[2:].tolist(), strict=True)))
        last = sums[-1]
        shared, rows = last["shared_rows"], last["rows_sent"]
        path = "gloo" if not shared else "shm" if shared == rows else "mixed"
        result[name] = {"seconds": statistics.median(times), "wire_bytes": last["bytes_sent"],
                        "shm_bytes": last["shared_bytes"], "meta_bytes": last["meta_bytes"],
                        "driver_bytes": driver[-1], "path": path}
        buf.close()
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


def bench_scaling(steps: int, timeout: float) -> dict:
    """Main job at 1 and 2 CPU workers, 16 prompts (x rollout.n samples) per worker, run by
    tools/bench/scaling.py (which also probes the machine and splits the step by node: use
    it directly for the full report)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "scaling", os.path.join(os.path.dirname(os.path.abspath(__file__)), "scaling.py"))
    scaling = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scaling)
    out: dict = {}
    for n in (1, 2):
        try:
            run = scaling.run_job(n, steps, 16, [], timeout)
        except Exception as err:  # report, do not crash the whole benchmark
            return {"error": f"{n} worker(s): {type(err).__name__}: {err}", **out}
        out[n] = {"steps_per_s": 1 / run["step_s"], "prompts_per_s": 16 * n / run["step_s"],
                  "steps_measured": run["steps_measured"]}
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
    print(f"{'setup':<36}{'path':>6}{'seconds':>9}{'GB/s':>7}{'wire MB':>9}{'shm MB':>8}"
          f"{'meta KB':>9}{'driver MB':>11}{'/memcpy':>9}{'/central':>10}")
    print(f"{'memcpy (clone, 1 process)':<36}{'':>6}{result['memcpy']['seconds']:>9.4f}"
          f"{memcpy:>7.2f}")
    for n in args.workers:
        res = bench_workers(n, {"rows": args.rows, "width": args.width, "repeat": args.repeat})
        for entry in res.values():
            entry["gbps"] = size / entry["seconds"] / 1e9
        ours, central = res["databuffer"], res["centralized"]
        res["ratio_to_memcpy"] = ours["gbps"] / memcpy
        res["ratio_to_centralized"] = ours["gbps"] / central["gbps"]
        res["gloo_ratio_to_memcpy"] = res["databuffer-gloo"]["gbps"] / memcpy
        result["workers"][str(n)] = res
        shape = f"DP{n}->DP{n // 2}"
        for name in ("databuffer", "databuffer-gloo", "centralized"):
            entry = res[name]
            ratios = f"{entry['gbps'] / memcpy:>9.3f}"
            if name != "centralized":
                ratios += f"{entry['gbps'] / central['gbps']:>10.2f}"
            print(f"{f'{name} {shape} ({n} procs)':<36}{entry['path']:>6}"
                  f"{entry['seconds']:>9.4f}{entry['gbps']:>7.2f}"
                  f"{entry['wire_bytes'] / 1e6:>9.1f}{entry['shm_bytes'] / 1e6:>8.1f}"
                  f"{entry['meta_bytes'] / 1e3:>9.1f}{entry['driver_bytes'] / 1e6:>11.1f}"
                  f"{ratios}")
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
    write_result(result, args.out, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
