"""siiRL's worker order under megatron's pipeline-last layout (siirl.engine.megatron.
rank_order): the dense groups are those of ``tp-cp-pp-dp`` (a pipeline's workers
consecutive, as the planner lays them out), and megatron's expert groups, which it builds
consistently only in its pipeline-last order, split each pipeline stage's experts over the
data-parallel ranks of that stage. Checked on megatron's own rank generators, no processes."""

import pytest

from siirl_suites import megatron_full

pytest.importorskip("megatron.core")


def _groups(tp, pp, dp, ep=1, etp=None, translated=True):
    from megatron.core.parallel_state import RankGenerator

    from siirl.engine.megatron.rank_order import MEGATRON_ORDER, siirl_worker_order

    world = tp * pp * dp
    etp = etp or tp
    dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=1,
                          order=MEGATRON_ORDER if translated else "tp-cp-ep-pp-dp")
    expert = RankGenerator(tp=etp, ep=ep, dp=world // (etp * ep * pp), pp=pp, cp=1,
                           order=MEGATRON_ORDER)
    if not translated:
        return {token: dense.get_ranks(token) for token in ("tp", "pp", "dp", "tp-pp")}
    with siirl_worker_order(tp, 1, pp, world):
        out = {token: dense.get_ranks(token) for token in ("tp", "pp", "dp", "tp-pp")}
        out.update({f"expert {token}": expert.get_ranks(token)
                    for token in ("tp", "ep", "dp", "pp", "tp-ep")})
    return out


def test_dense_groups_are_the_consecutive_pipeline_layout():
    for tp, pp, dp in ((1, 1, 4), (2, 1, 2), (1, 2, 2), (2, 2, 2), (1, 4, 2)):
        assert {k: sorted(map(sorted, v)) for k, v in _groups(tp, pp, dp).items()
                if not k.startswith("expert")} == \
            {k: sorted(map(sorted, v)) for k, v in _groups(tp, pp, dp, translated=False)
             .items()}, (tp, pp, dp)
    groups = _groups(1, 2, 4)
    assert groups["pp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]  # a pipeline: consecutive
    assert sorted(groups["dp"]) == [[0, 2, 4, 6], [1, 3, 5, 7]]  # one stage of each


def test_experts_split_over_the_data_parallel_ranks_of_each_stage():
    """EP 2 x PP 2 on 8 workers (and expert TP 1 under TP 2): every expert group lies in
    one pipeline stage, the expert-parallel groups of a stage partition its workers, and
    the expert pipeline groups are the dense ones (megatron asserts that too)."""
    for tp, etp in ((1, 1), (2, 1)):
        groups = _groups(tp, 2, 8 // (2 * tp), ep=2, etp=etp)
        stage = {w: (w // tp) % 2 for w in range(8)}  # siiRL's order: tp, then pp
        for token in ("expert ep", "expert dp", "expert tp", "expert tp-ep"):
            for group in groups[token]:
                assert len({stage[w] for w in group}) == 1, (tp, token, group)
        ep = groups["expert ep"]
        assert all(len(g) == 2 for g in ep)
        assert sorted(w for g in ep for w in g) == list(range(8))
        assert sorted(map(sorted, groups["expert pp"])) == sorted(map(sorted, groups["pp"]))


LAYOUTS = {  # what megatron refused in siiRL's order before: (the reference, the layout)
    # PP 2 x DP 2: experts split over the two data-parallel ranks of each stage
    "ep2_pp2": ([], ["expert_model_parallel_size=2"]),
    # TP 2 (+SP) x PP 2: whole experts (expert TP 1), replicated over the TP pair
    "tp2_etp1_pp2": (["tensor_model_parallel_size=2", "sequence_parallel=true"],
                     ["tensor_model_parallel_size=2", "sequence_parallel=true",
                      "expert_tensor_parallel_size=1"]),
}


def _ep_pp_rank(rank: int, world: int, port: int, out: str, layout: str) -> None:
    """One of 4 ranks at PP 2: the tiny MoE actor's log-probs and first update in the
    reference layout, then in ``layout``."""
    import torch
    from megatron.core import parallel_state

    from siirl.engine.megatron.engines import megatron_actor
    from siirl.params.parser import parse_config
    from siirl_rollout_rows import rollout_rows
    from siirl_spawn import finish_rank, start_gloo_rank

    start_gloo_rank(rank, world, port, 180)
    actor_key = "actor_rollout_ref.actor"
    result = {}
    for which, keys in enumerate(LAYOUTS[layout]):
        actor = megatron_actor(parse_config([
            "trainer.device=cpu", f"trainer.n_gpus_per_node={world}",
            f"{actor_key}.strategy=megatron", "actor_rollout_ref.model.path=builtin:tiny-moe",
            "actor_rollout_ref.rollout.n=1", f"{actor_key}.ppo_mini_batch_size=4",
            f"{actor_key}.ppo_micro_batch_size_per_gpu=2", f"{actor_key}.use_kl_loss=false",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            # Adam's first step is about lr x sign(gradient): at a large lr the rounding of
            # near-zero gradient elements (summed in another order by another layout) would
            # show as lr-sized differences
            f"{actor_key}.optim.lr=1e-4", f"{actor_key}.megatron.pipeline_model_parallel_size=2",
            *(f"{actor_key}.megatron.{key}" for key in keys)]))
        batch = rollout_rows(vocab=58, seed=parallel_state.get_data_parallel_rank())
        batch = actor.compute_log_prob(batch).batch
        result[which] = {"old": batch["old_log_probs"].clone(),
                      "metrics": actor.update_policy(batch).metrics,
                      "after": actor.compute_log_prob(batch).batch["old_log_probs"].clone()}
        parallel_state.destroy_model_parallel()
    torch.save(result, f"{out}/rank{rank}.pt")
    finish_rank()


@megatron_full
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_experts_laid_out_with_pipeline_stages_train_like_the_reference(tmp_path, layout):
    import torch
    import torch.multiprocessing as mp
    from test_megatron_bridge import free_port

    from siirl_spawn import join_spawned

    context = mp.start_processes(_ep_pp_rank, args=(4, free_port(), str(tmp_path), layout),
                                 nprocs=4, join=False, start_method="spawn")
    join_spawned(context, f"the 4-rank {layout} actor run")
    tolerance = 1e-5  # float32, a few hundred rounded terms per log-prob and norm
    for rank in range(4):
        runs = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        for when in ("old", "after"):
            worst = float((runs[1][when] - runs[0][when]).abs().max())
            assert worst <= tolerance, (rank, when, worst)
        assert float((runs[0]["after"] - runs[0]["old"]).abs().max()) > 10 * tolerance
        for key in ("actor/pg_loss", "actor/grad_norm"):
            want, got = runs[0]["metrics"][key], runs[1]["metrics"][key]
            assert abs(got - want) <= tolerance * max(1.0, abs(want)), (rank, key, got, want)
