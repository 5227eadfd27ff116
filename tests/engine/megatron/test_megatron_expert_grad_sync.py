"""Expert parallelism where megatron's DDP does not run: the megatron critic averages
gradients by hand (``engines.grad_averager``; so would the actor with virtual pipeline
stages, but experts over pipeline stages are refused, see ``megatron.config``) and clips
them itself (``dp_utils.clip_grad_norm``). Expert parameters must then be reduced as
megatron's DDP reduces them (summed over the expert data-parallel group, divided by the
whole data-parallel size) and their squared norms summed over the expert
tensor-and-model-parallel group (expert TP x EP), or each rank would clip with its own
coefficient and the dense weights would drift apart.

Two gloo ranks (two data-parallel ranks, each its own rows) train the megatron critic on
``builtin:tiny-moe`` (4 experts, top-2) first at EP 1, then at EP 2 (two experts per rank,
tokens exchanged by megatron's alltoall dispatcher): values, value loss and grad norm of two
updates (two optimizer steps each, clipped) must agree within float32 rounding; at TP 2 x
EP 2 on four ranks too (``nox -s megatron``).
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from siirl.execution.scheduler.process_group_manager import free_port
from siirl_spawn import finish_rank, join_spawned, start_gloo_rank
from siirl_suites import megatron_full

pytest.importorskip("megatron.core")

ROWS, PROMPT, RESPONSE = 4, 5, 4  # rows per rank (tiny-moe: 58 token ids)
CLIP = 0.05  # below every step's grad norm: clipping scales every step
KEYS = ("critic/vf_loss", "critic/grad_norm", "critic/vpred_mean")


def _rows(rank: int):
    """This rank's left-padded prompts, right-padded responses and regression targets."""
    from siirl.data_coordinator.protocol import make_batch

    g = torch.Generator().manual_seed(10 + rank)
    prompts = torch.randint(3, 58, (ROWS, PROMPT), generator=g)
    responses = torch.randint(3, 58, (ROWS, RESPONSE), generator=g)
    prompt_mask = torch.ones(ROWS, PROMPT, dtype=torch.long)
    response_mask = torch.ones(ROWS, RESPONSE)
    for i in range(ROWS):
        prompt_mask[i, :i % 2] = 0
        prompts[i, :i % 2] = 0
        response_mask[i, RESPONSE - i % RESPONSE:] = 0
        responses[i, RESPONSE - i % RESPONSE:] = 0
    attention_mask = torch.cat([prompt_mask, response_mask.long()], dim=1)
    return make_batch({
        "prompts": prompts, "responses": responses, "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp_min(0),
        "returns": torch.randn(ROWS, RESPONSE, generator=g) * response_mask})


def _train_critic(ep: int, tp: int) -> dict:
    """Values before training, two updates' metrics, values after (this data-parallel
    rank's rows)."""
    from megatron.core import parallel_state

    from siirl.engine.megatron.engines import megatron_engine
    from siirl.params.parser import parse_config

    # TP: with sequence parallelism, which megatron's MoE layer needs under TP
    sizes = (("expert_model_parallel_size", ep), ("tensor_model_parallel_size", tp),
             ("sequence_parallel", str(tp > 1).lower()))
    megatron = [f"{role}.megatron.{key}={value}" for key, value in sizes
                for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")]
    config = parse_config([
        "actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron",
        "algorithm.adv_estimator=gae", "trainer.device=cpu",
        f"trainer.n_gpus_per_node={2 * tp}",
        "actor_rollout_ref.model.path=builtin:tiny-moe", "critic.model.path=builtin:tiny-moe",
        "actor_rollout_ref.rollout.n=1", "critic.ppo_mini_batch_size=4",
        "critic.ppo_micro_batch_size_per_gpu=2", "critic.optim.lr=0.01",
        "critic.optim.weight_decay=0.0", f"critic.grad_clip={CLIP}", *megatron])
    engine = megatron_engine("critic", config)
    assert parallel_state.get_expert_model_parallel_world_size() == ep
    batch = _rows(parallel_state.get_data_parallel_rank())
    result = {"before": engine.compute_values(batch).batch["values"].clone(), "metrics": []}
    for _ in range(2):  # the critic node leaves the current values in the batch
        result["metrics"].append(engine.update_critic(batch).metrics)
        engine.compute_values(batch)
    result["after"] = batch["values"].clone()
    parallel_state.destroy_model_parallel()
    return result


def _rank_main(rank: int, world_size: int, port: int, out: str, tp: int) -> None:


    start_gloo_rank(rank, world_size, port, 120)
    runs = {ep: _train_critic(ep, tp) for ep in (1, 2)}
    torch.save(runs, f"{out}/rank{rank}.pt")
    finish_rank()  # a failing rank raises instead


def _check_critic_at_ep_2(tmp_path, tp: int) -> None:
    """2 data-parallel ranks (x ``tp``): EP 2 gives EP 1's values, losses and norms."""
    world = 2 * tp
    context = mp.start_processes(_rank_main, args=(world, free_port(), str(tmp_path), tp),
                                 nprocs=world, join=False, start_method="spawn")
    join_spawned(context, f"the {world}-rank megatron critic run")
    tolerance = 1e-5  # float32: a few hundred rounded terms per value and per norm
    for rank in range(world):
        runs = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        ep1, ep2 = runs[1], runs[2]
        for when in ("before", "after"):
            worst = float((ep2[when] - ep1[when]).abs().max())
            assert worst <= tolerance, (rank, when, worst)
        assert float((ep1["after"] - ep1["before"]).abs().max()) > 100 * tolerance
        for step, (got, want) in enumerate(zip(ep2["metrics"], ep1["metrics"], strict=True)):
            assert want["critic/grad_norm"] > CLIP, "clipping must be exercised"
            for key in KEYS:
                assert abs(got[key] - want[key]) <= tolerance * max(1.0, abs(want[key])), \
                    (rank, step, key, got[key], want[key])


def test_megatron_critic_at_expert_parallel_2_trains_like_ep_1(tmp_path):
    _check_critic_at_ep_2(tmp_path, tp=1)


@pytest.mark.slow
@megatron_full
def test_megatron_critic_at_tp_2_by_ep_2_trains_like_ep_1(tmp_path):
    """Four ranks: TP 2 (+ sequence parallelism) x 2 data-parallel ranks, each expert split
    over TP too (expert TP = TP): the expert squares are summed over the expert
    tensor-and-model-parallel group (expert TP x EP); expert TP other than TP:
    test_megatron_expert_tp.py."""
    _check_critic_at_ep_2(tmp_path, tp=2)


@pytest.mark.slow
@megatron_full
def test_ppo_with_a_megatron_critic_at_ep_2_on_two_ray_workers_trains_like_one_worker(tmp_path):
    """End to end (validation, planner, Ray CPU workers): PPO on builtin:tiny-moe with actor,
    reference and critic on megatron at EP 2 over two workers gives the one-worker run's
    losses and grad norms (steps 1 and 2, within 1e-5)."""
    from test_megatron_engine import (
        MEGATRON,
        PPO,
        PPO_KEYS,
        assert_close_steps,
        ray_workers,
        steps,
        train,
    )

    run = [*PPO, *MEGATRON, "critic.strategy=megatron", "trainer.save_freq=-1",
           "actor_rollout_ref.model.path=builtin:tiny-moe", "critic.model.path=builtin:tiny-moe"]
    train(tmp_path / "one", *run)
    overrides, env = ray_workers(2)
    experts = [f"{role}.megatron.expert_model_parallel_size=2"
               for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")]
    train(tmp_path / "ep2", *run, *experts, *overrides, env=env)
    assert_close_steps(steps(tmp_path / "ep2"), steps(tmp_path / "one"), PPO_KEYS)
