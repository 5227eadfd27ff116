"""The megatron half of ``check_offload.py``: verl's ``megatron.param_offload``,
``grad_offload`` and ``optimizer_offload`` (siirl.engine.megatron.offload) on a CUDA GPU.

1. engine: a bf16 megatron actor (megatron's DDP + distributed optimizer, one NCCL rank)
   with all three offloads frees its weights, gradient buffers and optimizer state from the
   GPU between verbs (``torch.cuda.memory_allocated`` drops by what it parked), computes on
   the GPU, and updates exactly like a resident one; a checkpoint saved while parked loads
   into a parked actor;
2. ``siirl-train``: 2 PPO steps with actor, reference and critic on megatron in bf16, each
   offloaded, log the resident run's metrics, and the run resumes from its checkpoint.

``--cpu`` (check_offload.py's dry run): the keys are refused on a CPU run, so the engine
part attaches the offloader itself (host memory is then a second CPU buffer) and the
training runs are resident.
"""

from __future__ import annotations

from pathlib import Path

import torch

ACTOR = "actor_rollout_ref.actor"
BF16 = [f"{role}.megatron.dtype=bfloat16" for role in (ACTOR, "actor_rollout_ref.ref", "critic")]
ENGINE = [f"{ACTOR}.strategy=megatron", f"{ACTOR}.ppo_mini_batch_size=4",
          f"{ACTOR}.ppo_micro_batch_size_per_gpu=2", f"{ACTOR}.optim.lr=0.01",
          "actor_rollout_ref.rollout.n=1", f"{ACTOR}.use_kl_loss=false",
          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", BF16[0]]
OFFLOAD = [f"{ACTOR}.megatron.{key}=true"
           for key in ("param_offload", "grad_offload", "optimizer_offload")]
TRAIN = [f"{ACTOR}.strategy=megatron", "actor_rollout_ref.ref.strategy=megatron",
         "critic.strategy=megatron", *BF16]
TRAIN_OFFLOAD = [*OFFLOAD, "actor_rollout_ref.ref.megatron.param_offload=true",
                 *(f"critic.megatron.{key}=true"
                   for key in ("param_offload", "grad_offload", "optimizer_offload"))]


def _weights(engine) -> dict:
    return {name: tensor.float().cpu().clone() for bucket in engine.export_weights(1 << 20)
            for name, tensor in bucket}


def _actor(device: str, offloaded: bool):
    from siirl.engine.megatron.engines import megatron_actor
    from siirl.engine.megatron.offload import OffloadSettings, backend_offloader
    from siirl.params.parser import parse_config

    on_gpu = device == "cuda"
    engine = megatron_actor(parse_config([f"trainer.device={device}", *ENGINE,
                                          *(OFFLOAD if offloaded and on_gpu else [])]))
    if offloaded and not on_gpu:  # dry run: what the factory attaches on a GPU
        backend = engine.backend
        backend.offload = backend_offloader(OffloadSettings(True, True, True), backend.module,
                                            backend.optimizer, torch.device("cpu"))
    return engine


def engine_check(workdir: Path, rows, device: str, tol: float) -> dict:
    """Resident and offloaded bf16 actors, same update; what parking frees on the GPU."""
    result = {}
    for name in ("resident", "offloaded"):
        engine = _actor(device, name == "offloaded")
        batch = engine.compute_log_prob(rows()).batch
        metrics = engine.update_policy(batch).metrics
        result[name] = {"backend_device": str(engine.backend.device),
                        "metrics": {k: v for k, v in metrics.items()
                                    if not k.startswith("perf/")},
                        "weights": _weights(engine)}
        if name == "offloaded":
            offload = engine.backend.offload
            result["parked_bytes"] = dict(offload.moved_bytes)
            if device == "cuda":
                offload.fetch(grads=True, optimizer=True)
                resident_bytes = torch.cuda.memory_allocated()
                offload.park()
                result["freed_bytes"] = resident_bytes - torch.cuda.memory_allocated()
            engine.save_checkpoint(str(workdir / "ckpt"))
            fresh = _actor(device, True)
            fresh.load_checkpoint(str(workdir / "ckpt"))
            reloaded = _weights(fresh)
            result["checkpoint_max_diff"] = max(
                (reloaded[k] - result[name]["weights"][k]).abs().max().item()
                for k in reloaded)
        del engine
    off, res = result["offloaded"], result["resident"]
    weight_diff = max((off["weights"][k] - res["weights"][k]).abs().max().item()
                      for k in res["weights"])
    metric_diff = max(abs(off["metrics"][k] - res["metrics"][k]) for k in res["metrics"])
    parked = sum(result["parked_bytes"].values())
    checks = {"weights, gradients and optimizer state parked":
              all(v > 0 for v in result["parked_bytes"].values())}
    if device == "cuda":
        checks |= {"offloaded actor computes on the GPU": off["backend_device"]
                   .startswith("cuda"),
                   "parking frees what it moved from the GPU":
                   result["freed_bytes"] >= 0.9 * parked}
    checks |= {"same metrics": metric_diff <= tol,
               "same weights after the update": weight_diff <= tol,
               "checkpoint restores the weights": result["checkpoint_max_diff"] == 0.0}
    for part in (off, res):
        part.pop("weights")
    return {"checks": checks, "metric_max_diff": metric_diff, "weight_max_diff": weight_diff,
            **result}


def train_check(workdir: Path, train, max_metric_diff, device: str, tol: float) -> dict:
    """``train`` / ``max_metric_diff``: check_offload.py's (a siirl-train run's metrics)."""
    resident = train(workdir / "resident", "trainer.save_freq=-1", *TRAIN, device=device)
    offloaded = train(workdir / "offloaded", "trainer.save_freq=2", *TRAIN, *TRAIN_OFFLOAD,
                      device=device)
    diff, where = max_metric_diff(resident, offloaded)
    resumed = train(workdir / "offloaded", "trainer.save_freq=-1", *TRAIN, *TRAIN_OFFLOAD,
                    steps=3, device=device)
    return {"checks": {"offloaded megatron run logs the resident run's metrics": diff <= tol,
                       "offloaded megatron run resumes from its checkpoint": 3 in resumed},
            "metric_max_diff": diff, "worst": where}
