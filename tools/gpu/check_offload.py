"""Check FSDP2 CPU offload (``fsdp_config.param_offload``) and, with 2 GPUs or more, Ulysses
sequence parallelism on NCCL, on a CUDA machine.

    python tools/gpu/check_offload.py [--out offload_gpu.json]

CPU runs refuse offload (there is nothing to offload to) and check Ulysses on gloo
(tests/engine/fsdp/test_ulysses.py, tests/e2e/test_ulysses_train.py); this script checks
what only a GPU has:

1. engine: an offloaded actor (builtin tiny model, one NCCL rank) keeps its parameter
   shards in host memory, computes on the GPU, and updates like a resident one (metrics
   and weights within 1e-4); a checkpoint round trip restores its weights exactly; its
   weight export (for vllm/sglang) gathers full tensors;
2. ``siirl-train``: 2 PPO steps (actor, reference and critic offloaded, hf rollout,
   checkpoint at step 2) log the resident run's metrics, and the run resumes from its
   checkpoint;
3. with 2+ GPUs: one step with ``ulysses_sequence_parallel_size=2`` on 2 workers logs the
   1-worker run's metrics;
4. megatron (``megatron_offload_check.py``): verl's ``megatron.param_offload``,
   ``grad_offload`` and ``optimizer_offload`` park a bf16 actor's weights, gradients and
   optimizer state off the GPU between verbs (the memory they held is freed), and the
   engine and a PPO run with every role offloaded train like resident ones.

Prints one line per check and writes JSON; exits 1 when a check fails, 2 without CUDA.
``--cpu`` dry-runs the script on the CPU (gloo, nothing offloaded: the "offloaded" runs are
resident there, so only the comparisons, the checkpoint and the resume are checked).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import torch

TOL = 1e-4
ACTOR = ["trainer.device=cuda", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
         "actor_rollout_ref.actor.optim.lr=0.01", "actor_rollout_ref.rollout.n=1",
         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
         "actor_rollout_ref.model.use_remove_padding=true",
         "actor_rollout_ref.model.enable_gradient_checkpointing=true"]
TRAIN = ["algorithm.adv_estimator=gae", "data.train_batch_size=8",
         "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
         "critic.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.use_kl_loss=true",
         "actor_rollout_ref.model.use_remove_padding=true",
         "critic.model.use_remove_padding=true", "trainer.logger=[]",
         "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.device=cuda",
         "trainer.seed=7"]
OFFLOAD = ["actor_rollout_ref.actor.fsdp_config.param_offload=true",
           "actor_rollout_ref.ref.fsdp_config.param_offload=true",
           "critic.model.fsdp_config.optimizer_offload=true"]
IGNORED = ("timing_s/", "perf/", "timing/", "databuffer/", "weight_sync/")


def rows():
    from siirl.data_coordinator.protocol import make_batch

    prompts, responses = [[5, 6, 7], [8, 9, 10, 11], [14], [15, 16]], \
        [[3, 4, 2], [20, 21], [25, 26, 27, 28], [30]]
    plen, rlen = 4, 4
    ids = torch.zeros((4, plen + rlen), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        ids[i, plen - len(p):plen] = torch.tensor(p)
        ids[i, plen:plen + len(r)] = torch.tensor(r)
        mask[i, plen - len(p):plen + len(r)] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    response_mask = mask[:, plen:].float()
    return make_batch({"input_ids": ids, "attention_mask": mask, "position_ids": pos,
                       "responses": ids[:, plen:], "response_mask": response_mask,
                       "advantages": response_mask * torch.linspace(-1.0, 2.0, 4)[:, None]})


def full_weights_of(engine) -> dict:
    """The weights the rollout would receive (full tensors, gathered)."""
    out = {}
    for bucket in engine.export_weights(1 << 20):
        for name, tensor in bucket:
            out[name] = tensor.detach().float().cpu().clone()
    return out


def on_device(overrides: list, device: str) -> list:
    """The overrides for ``device``: on the CPU (dry run) nothing is offloaded."""
    if device == "cuda":
        return list(overrides)
    return [f"trainer.device={device}" if o.startswith("trainer.device=") else o
            for o in overrides if "_offload=" not in o]


def engine_check(workdir: Path, device: str = "cuda") -> dict:
    """An offloaded and a resident actor (both FSDP2 over one NCCL rank), same update."""
    import torch.distributed as dist

    from siirl.engine.fsdp.engines import fsdp_actor
    from siirl.execution.scheduler.process_group_manager import free_port
    from siirl.params.parser import parse_config

    if device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if device == "cuda" else "gloo",
                            init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        result = {}
        for name, extra in (("resident", ["actor_rollout_ref.actor.fsdp_config.fsdp_size=-1"]),
                            ("offloaded", ["actor_rollout_ref.actor.fsdp_config."
                                           "param_offload=true"])):
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            extra = on_device(ACTOR + extra, device)
            engine = fsdp_actor(parse_config(extra))
            devices = {p.to_local().device.type if hasattr(p, "to_local") else p.device.type
                       for p in engine.module.parameters()}
            batch = engine.compute_log_prob(rows()).batch
            metrics = engine.update_policy(batch).metrics
            result[name] = {"param_devices": sorted(devices),
                            "backend_device": str(engine.backend.device),
                            "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20
                            if device == "cuda" else None,
                            "metrics": {k: v for k, v in metrics.items()
                                        if not k.startswith("perf/")},
                            "weights": full_weights_of(engine)}
            if name == "offloaded":
                engine.save_checkpoint(str(workdir / "ckpt"))
                fresh = fsdp_actor(parse_config(extra))
                fresh.load_checkpoint(str(workdir / "ckpt"))
                reloaded = full_weights_of(fresh)
                result["checkpoint_max_diff"] = max(
                    (reloaded[k] - result[name]["weights"][k]).abs().max().item()
                    for k in reloaded)
        off, res = result["offloaded"], result["resident"]
        weight_diff = max((off["weights"][k] - res["weights"][k]).abs().max().item()
                          for k in res["weights"])
        metric_diff = max(abs(off["metrics"][k] - res["metrics"][k]) for k in res["metrics"])
        checks = {} if device != "cuda" else {
            "offloaded shards live on the CPU": off["param_devices"] == ["cpu"],
            "offloaded actor computes on the GPU": off["backend_device"].startswith("cuda"),
            "resident shards live on the GPU": res["param_devices"] == ["cuda"]}
        checks |= {
            "same metrics": metric_diff <= TOL,
            "same weights after the update": weight_diff <= TOL,
            "checkpoint restores the weights": result["checkpoint_max_diff"] == 0.0,
        }
        for part in (off, res):
            part.pop("weights")
        return {"checks": checks, "metric_max_diff": metric_diff,
                "weight_max_diff": weight_diff, **result}
    finally:
        dist.destroy_process_group()


def train(run_dir: Path, *overrides: str, steps: int = 2, device: str = "cuda") -> dict:
    """Step -> metrics of a ``siirl-train`` run (a fresh Ray per run)."""
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    command = [sys.executable, "-m", "siirl.main_dag", f"trainer.default_local_dir={run_dir}",
               f"trainer.ray_temp_dir={ray_dir}", f"trainer.total_training_steps={steps}",
               *on_device([*TRAIN, *overrides], device)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1200,
                          env=dict(os.environ, RAY_AUTH_MODE="disabled", RAY_ADDRESS=""))
    if proc.returncode != 0:
        raise RuntimeError(f"siirl-train failed ({' '.join(overrides)}):\n"
                           f"{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text()
               .splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if isinstance(v, (int, float))
                        and not k.startswith(IGNORED)}
            for r in records if "critic/score/mean" in r}


def max_metric_diff(a: dict, b: dict) -> tuple:
    worst = (0.0, None)
    for step in a:
        for key, value in a[step].items():
            diff = abs(b[step].get(key, float("nan")) - value) / max(1.0, abs(value))
            if not diff <= worst[0]:
                worst = (diff, f"step {step} {key}")
    return worst


def train_check(workdir: Path, device: str = "cuda") -> dict:
    resident = train(workdir / "resident", "trainer.save_freq=-1", device=device)
    offloaded = train(workdir / "offloaded", "trainer.save_freq=2", *OFFLOAD, device=device)
    diff, where = max_metric_diff(resident, offloaded)
    resumed = train(workdir / "offloaded", "trainer.save_freq=-1", *OFFLOAD, steps=3,
                    device=device)
    return {"checks": {"offloaded run logs the resident run's metrics": diff <= TOL,
                       "offloaded run resumes from its checkpoint": 3 in resumed},
            "metric_max_diff": diff, "worst": where}


def ulysses_check(workdir: Path) -> dict:
    split = ["trainer.n_gpus_per_node=2", "trainer.ray_address=local",
             "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
             "critic.ulysses_sequence_parallel_size=2", "trainer.save_freq=-1"]
    one = train(workdir / "one", "trainer.save_freq=-1", steps=1)
    two = train(workdir / "split", *split, steps=1)
    diff, where = max_metric_diff(one, two)
    return {"checks": {"2 GPUs in one Ulysses group log the 1-GPU run's metrics":
                       diff <= TOL}, "metric_max_diff": diff, "worst": where}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="offload_gpu.json")
    parser.add_argument("--cpu", action="store_true", help="dry run of this script on the CPU")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.cpu:
        print("check_offload.py needs a CUDA GPU (CPU runs refuse offload; Ulysses on CPU "
              "is covered by the tests; --cpu dry-runs the script)")
        return 2
    device = "cpu" if args.cpu else "cuda"
    report = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (dry run)",
              "gpus": torch.cuda.device_count()}
    import megatron_offload_check as megatron

    parts = [("engine", lambda w: engine_check(w, device)),
             ("train", lambda w: train_check(w, device)),
             ("megatron_engine", lambda w: megatron.engine_check(w, rows, device, TOL)),
             ("megatron_train", lambda w: megatron.train_check(w, train, max_metric_diff,
                                                               device, TOL))]
    if device == "cuda" and torch.cuda.device_count() >= 2:
        parts.append(("ulysses", ulysses_check))
    else:
        report["ulysses"] = {"skipped": "needs 2 GPUs (NCCL puts one rank on each)"}
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for name, check in parts:
            try:
                report[name] = check(Path(tmp) / name)
            except Exception:  # record it and go on to the next part
                report[name] = {"checks": {"ran": False}, "traceback": traceback.format_exc()}
            for what, ok in report[name]["checks"].items():
                failed |= not ok
                print(f"{'ok  ' if ok else 'FAIL'} {name}: {what}")
            if "traceback" in report[name]:
                print(report[name]["traceback"])
    Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
