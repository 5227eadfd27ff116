"""Expert tensor parallelism other than TP (``megatron.expert_tensor_parallel_size``): the
attention and dense layers split over TP 2 (with sequence parallelism, which megatron's MoE
layer needs under TP) while every expert stays whole (expert TP 1) and the experts are spread
by expert parallelism (EP 2), or replicated on both TP ranks (EP 1: an expert data-parallel
group of 2 where the dense layers have one data-parallel rank).

The megatron actor (megatron's DDP and optimizer) and critic (gradients averaged and clipped
by hand, ``engines.grad_averager`` / ``dp_utils.clip_grad_norm``) of ``builtin:tiny-moe`` on
two gloo ranks must give one worker's (TP 1, EP 1) log-probs, values, and two updates'
losses, grad norms and weights within float32 rounding: the bridge splits and gathers the
experts over the expert-TP group, their gradients are summed over the expert data-parallel
group and their squared norms over the expert tensor-and-model-parallel group.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from siirl_spawn import finish_rank, join_spawned, start_gloo_rank

pytest.importorskip("megatron.core")

from test_megatron_bridge import free_port  # noqa: E402
from test_megatron_expert_grad_sync import CLIP, _rows  # noqa: E402

ACTOR = "actor_rollout_ref.actor"
ROLES = (ACTOR, "actor_rollout_ref.ref", "critic")
ACTOR_KEYS = ("actor/pg_loss", "actor/grad_norm")
CRITIC_KEYS = ("critic/vf_loss", "critic/grad_norm", "critic/vpred_mean")
# name: (workers, TP, expert TP, EP)
LAYOUTS = {"one worker": (1, 1, None, 1), "tp2 etp1 ep2": (2, 2, 1, 2),
           "tp2 etp1 ep1": (2, 2, 1, 1)}
TOLERANCE = 1e-5  # float32: a few hundred rounded terms per log-prob, value and norm
# Adam moves every weight by about lr whatever its gradient's size, so a gradient element
# at rounding level whose sign differs between layouts moves that weight by ~lr the other
# way: at lr 1e-2 the actor's log-probs after two steps differ by ~1e-4 at plain TP 2 too
ACTOR_LR = 1e-4


def _config(workers: int, tp: int, etp: int | None, ep: int):
    from siirl.params.parser import parse_config

    sizes = [("tensor_model_parallel_size", tp), ("expert_model_parallel_size", ep),
             ("sequence_parallel", str(tp > 1).lower())]
    if etp is not None:
        sizes.append(("expert_tensor_parallel_size", etp))
    return parse_config([
        f"{ACTOR}.strategy=megatron", "critic.strategy=megatron", "algorithm.adv_estimator=gae",
        "trainer.device=cpu", f"trainer.n_gpus_per_node={workers}",
        "actor_rollout_ref.model.path=builtin:tiny-moe", "critic.model.path=builtin:tiny-moe",
        "actor_rollout_ref.rollout.n=1", f"{ACTOR}.ppo_mini_batch_size=4",
        f"{ACTOR}.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        f"{ACTOR}.use_kl_loss=false", f"{ACTOR}.optim.lr={ACTOR_LR}", f"{ACTOR}.grad_clip={CLIP}",
        "critic.ppo_mini_batch_size=4", "critic.ppo_micro_batch_size_per_gpu=2",
        "critic.optim.lr=0.01", "critic.optim.weight_decay=0.0", f"critic.grad_clip={CLIP}",
        *(f"{role}.megatron.{key}={value}" for key, value in sizes for role in ROLES)],
        validate=True)


def _batch():
    """The same 4 rows on every rank (one data-parallel rank in every layout)."""
    batch = _rows(0)
    batch["advantages"] = torch.randn(batch["responses"].shape,
                                      generator=torch.Generator().manual_seed(7))
    return batch


def _train(layout: str) -> dict:
    """Log-probs and values before, two actor and two critic updates' metrics, log-probs and
    values after, and the actor's HF export."""
    from megatron.core import parallel_state as ps

    from siirl.data_coordinator.fields import OLD_LOG_PROBS
    from siirl.engine.megatron.bridge import iter_hf_weights
    from siirl.engine.megatron.engines import megatron_engine

    workers, tp, etp, ep = LAYOUTS[layout]
    config = _config(workers, tp, etp, ep)
    actor = megatron_engine("actor", config)
    assert (ps.get_tensor_model_parallel_world_size(), ps.get_expert_model_parallel_world_size(),
            ps.get_expert_tensor_parallel_world_size(),
            ps.get_data_parallel_world_size()) == (tp, ep, etp or tp, 1)
    batch = actor.compute_log_prob(_batch()).batch
    result = {"logprobs": batch[OLD_LOG_PROBS].clone(), "actor": [], "critic": []}
    for _ in range(2):
        result["actor"].append(actor.update_policy(batch).metrics)
    result["logprobs after"] = actor.compute_log_prob(_batch()).batch[OLD_LOG_PROBS].clone()
    with torch.no_grad():
        result["export"] = {name: tensor.clone() for bucket in iter_hf_weights(
            actor.backend.schedule_model, actor.backend.hf_module.config,
            tp_group=actor.backend.tp_group) for name, tensor in bucket}
    critic = megatron_engine("critic", config)
    result["values"] = critic.compute_values(batch).batch["values"].clone()
    for _ in range(2):  # the critic node leaves the current values in the batch
        result["critic"].append(critic.update_critic(batch).metrics)
        critic.compute_values(batch)
    result["values after"] = batch["values"].clone()
    ps.destroy_model_parallel()
    return result


def _rank_main(rank: int, world: int, port: int, out: str, layouts: tuple) -> None:
    start_gloo_rank(rank, world, port, 120)
    torch.save({layout: _train(layout) for layout in layouts}, f"{out}/rank{rank}.pt")
    finish_rank()  # a failing rank raises instead


def _run(tmp_path, world: int, layouts: tuple) -> list:
    out = tmp_path / "-".join(layout.replace(" ", "_") for layout in layouts)
    out.mkdir()
    context = mp.start_processes(_rank_main, args=(world, free_port(), str(out), layouts),
                                 nprocs=world, join=False, start_method="spawn")
    join_spawned(context, f"the {world}-rank megatron expert-TP run")
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(world)]


def _assert_close(got, want, what) -> None:
    worst = float((got - want).abs().max())
    assert worst <= TOLERANCE, (what, worst)


def test_tp_2_with_whole_experts_trains_like_one_worker(tmp_path):
    (one,) = _run(tmp_path, 1, ("one worker",))
    want = one["one worker"]
    assert float((want["logprobs after"] - want["logprobs"]).abs().max()) > 100 * TOLERANCE
    for rank, runs in enumerate(_run(tmp_path, 2, ("tp2 etp1 ep2", "tp2 etp1 ep1"))):
        for layout, got in runs.items():
            what = f"rank {rank} {layout}"
            for key in ("logprobs", "logprobs after", "values", "values after"):
                _assert_close(got[key], want[key], f"{what} {key}")
            # the export of the trained weights: every HF tensor, the experts gathered
            assert sorted(got["export"]) == sorted(want["export"]), what
            for name, tensor in want["export"].items():
                _assert_close(got["export"][name], tensor, f"{what} {name}")
            for role, keys in (("actor", ACTOR_KEYS), ("critic", CRITIC_KEYS)):
                for step, (mine, theirs) in enumerate(zip(got[role], want[role], strict=True)):
                    for key in keys:
                        assert abs(mine[key] - theirs[key]) <= \
                            TOLERANCE * max(1.0, abs(theirs[key])), \
                            (what, step, key, mine[key], theirs[key])
