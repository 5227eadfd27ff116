"""Ulysses sequence parallelism (``ulysses_sequence_parallel_size``) on CPU: two gloo ranks
splitting every packed sequence give one process's log-probs, entropy, values and
gradients, on the built-in tiny model (4 attention heads, 2 per rank), within what float32
rounding in another summation order allows (tests/siirl_numerics.py).

The heads are checked alone (the group's gradients summed, as FSDP reduces them, over the
group size, as FSDP averages), and the actor engine end to end: FSDP2 sharded over both
ranks, one update on the same rows, metrics, gradients and weights against the unsplit
packed actor in this process."""

import json
import os

import pytest
import torch
import torch.multiprocessing as mp

from siirl.data_coordinator.protocol import make_batch
from siirl.engine.fsdp import ulysses
from siirl.errors import ConfigError
from siirl_numerics import (
    assert_adam_step_close,
    assert_all_close,
    assert_close,
    optimizer_settings,
    rounding,
    scale_of,
    transformer_terms,
)
from siirl_spawn import finish_rank, join_spawned

HAVE_GLOO = torch.distributed.is_available() and torch.distributed.is_gloo_available()
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14], [15, 16]]
RESPONSES = [[3, 4, 2], [20, 21], [25, 26, 27, 28, 29, 30], []]  # 23 tokens: padded to 24
TEMPERATURE = 0.7
ACTOR = ["actor_rollout_ref.actor.ppo_mini_batch_size=4",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
         "actor_rollout_ref.actor.optim.lr=0.01", "actor_rollout_ref.actor.optim.weight_decay=0",
         "actor_rollout_ref.actor.entropy_coeff=0.01",
         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
         "actor_rollout_ref.rollout.n=1", "actor_rollout_ref.model.use_remove_padding=true"]


@pytest.fixture(autouse=True)
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def rows(advantages: bool = False):
    """Left-padded prompts, right-padded responses (positions keep counting on the right,
    as the rollout leaves them)."""
    plen, rlen = max(map(len, PROMPTS)), max(map(len, RESPONSES))
    n = len(PROMPTS)
    ids = torch.zeros((n, plen + rlen), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        ids[i, plen - len(p):plen] = torch.tensor(p)
        ids[i, plen:plen + len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, plen - len(p):plen + len(r)] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    pos[:, plen:] = pos[:, plen - 1:plen] + torch.arange(1, rlen + 1)
    fields = {"input_ids": ids, "attention_mask": mask, "position_ids": pos,
              "responses": ids[:, plen:], "response_mask": mask[:, plen:].float()}
    if advantages:
        fields["advantages"] = fields["response_mask"] * torch.linspace(-1.0, 2.0, n)[:, None]
    return make_batch(fields), rlen


def tiny_lm():
    from siirl.engine.models.loader import load_model
    from siirl.params import ModelArguments

    return load_model(ModelArguments(path=None), dtype=torch.float32)


def heads_and_grads(lm, value_model, sp=None):
    """The log-prob/entropy and value heads' outputs and the gradients of a weighted sum of
    them (summed over the group and divided by its size: what FSDP's average gives)."""
    from siirl.engine.fsdp.engines import logprob_heads, value_heads

    batch, rlen = rows()
    valid = batch["attention_mask"][:, -rlen:].bool()
    weights = valid * torch.linspace(-1.0, 1.0, valid.numel()).view_as(valid)
    result = {}
    for name, module, head in (
            ("lm", lm, logprob_heads(remove_padding=True, sp=sp)(rlen, TEMPERATURE, True)),
            ("value", value_model, value_heads(remove_padding=True, sp=sp)(rlen))):
        module.zero_grad()
        out = head.fn(module, batch)
        sum(out[n] * weights for n in head.outputs).sum().backward()
        grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
        if sp is not None:
            for grad in grads.values():
                torch.distributed.all_reduce(grad, group=sp.group)
                grad /= sp.size
        result[name] = ({k: v.detach() for k, v in out.items()}, grads)
    return result


def _rank_main(rank: int, world: int, port: int, workdir: str, what: str,
               size: int) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    exchanges, exchange = [0], ulysses.all_to_all

    def counting(*args):  # proves attention ran split, not on the whole row
        exchanges[0] += 1
        return exchange(*args)

    ulysses.all_to_all = counting
    if what == "heads":
        from siirl.engine.critic.value_model import value_model_from_lm

        ulysses.install()
        sp = ulysses.SequenceParallel(dist.group.WORLD, size, rank)
        result = heads_and_grads(tiny_lm(), value_model_from_lm(tiny_lm(), seed=0), sp)
    else:
        # the rows of this rank's data-parallel group (its Ulysses group's share)
        share = len(PROMPTS) * size // world
        result = actor_update([f"actor_rollout_ref.actor.ulysses_sequence_parallel_size="
                               f"{size}"], rank // size * share, share)
    result["exchanges"] = exchanges[0]
    torch.save(result, os.path.join(workdir, f"result{rank}.pt"))
    finish_rank()  # a failing rank raises instead


def actor_update(overrides, first: int = 0, count: int = len(PROMPTS)):
    """One update of the fsdp actor on ``count`` of ``rows`` from ``first``: metrics, full
    gradients and weights."""
    from siirl.engine.common.sharded_modules import full_weights
    from siirl.engine.fsdp.engines import fsdp_actor
    from siirl.params.parser import parse_config

    engine = fsdp_actor(parse_config(ACTOR + list(overrides)), module=tiny_lm())
    batch, _ = rows(advantages=True)
    batch = engine.compute_log_prob(batch[first:first + count]).batch
    metrics = engine.update_policy(batch).metrics
    module = engine.module
    grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
             for n, p in module.named_parameters() if p.grad is not None}
    with full_weights(module):
        weights = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
                   for n, p in module.named_parameters()}
    return {"metrics": json.dumps(metrics), "old_log_probs": batch["old_log_probs"],
            "grads": grads, "weights": weights,
            "optim": json.dumps(optimizer_settings(engine.backend.optimizer))}


def run_ranks(tmp_path, what: str, world: int = 2, size: int = 2):
    from siirl.execution.scheduler.process_group_manager import free_port

    context = mp.start_processes(_rank_main,
                                 args=(world, free_port(), str(tmp_path), what, size),
                                 nprocs=world, join=False, start_method="spawn")
    join_spawned(context, f"the {world}-rank Ulysses run")
    return [torch.load(tmp_path / f"result{r}.pt", weights_only=True) for r in range(world)]


def _terms(backward: bool) -> int:
    """Roundings on a value's path through the tiny model over every packed token."""
    batch, _ = rows()
    return transformer_terms(tiny_lm().config, int(batch["attention_mask"].sum()), backward)


def outputs_tolerance(want):
    return rounding(torch.float32, _terms(False), scale_of(want), want.numel())


def grads_tolerance(want):
    return rounding(torch.float32, _terms(True), scale_of(want), want.numel())


def check_metrics(metrics, want, keys, where=""):
    """Losses and entropy are means over the tokens of forward values; the gradient norm
    sums the squares of every parameter's gradient."""
    params = sum(p.numel() for p in tiny_lm().parameters())
    for key in keys:
        terms = _terms(True) + params if key == "actor/grad_norm" else _terms(False)
        tol = rounding(torch.float32, terms, max(abs(want[key]), 1.0))
        assert_close(metrics[key], want[key], tol, f"{where}{key}")


@pytest.mark.skipif(not HAVE_GLOO, reason="torch build without gloo")
def test_split_heads_give_the_unsplit_outputs_and_gradients(tmp_path):
    from siirl.engine.critic.value_model import value_model_from_lm

    want = heads_and_grads(tiny_lm(), value_model_from_lm(tiny_lm(), seed=0))
    results = run_ranks(tmp_path, "heads")
    for result in results:  # every rank of the group ends with the whole answer
        # 3 layers, 2 heads (log-probs, values): 4 exchanges per attention
        assert result["exchanges"] == 2 * 3 * 4
        for name in ("lm", "value"):
            (out, grads), (want_out, want_grads) = result[name], want[name]
            assert_all_close(out, want_out, outputs_tolerance, f"{name} ")
            assert len(grads) == len(want_grads) > 0
            assert_all_close(grads, want_grads, grads_tolerance, f"{name} gradient ")


@pytest.mark.skipif(not HAVE_GLOO, reason="torch build without gloo")
def test_actor_update_with_two_ranks_in_one_group_matches_one_process(tmp_path):
    want = actor_update([])
    want_metrics = json.loads(want["metrics"])
    results = run_ranks(tmp_path, "actor")
    for result in results:
        # 3 layers x 4 exchanges: one log-prob pass of 2 micro-batches, then the update's
        assert result["exchanges"] == 2 * 2 * 3 * 4
        metrics = json.loads(result["metrics"])
        check_metrics(metrics, want_metrics, ("actor/pg_loss", "actor/grad_norm",
                                              "actor/entropy", "actor/ppo_kl",
                                              "actor/pg_clipfrac"))
        assert_close(result["old_log_probs"], want["old_log_probs"],
                     outputs_tolerance(want["old_log_probs"]), "old_log_probs")
        check_update(result, want)


def check_update(result, want):
    assert_all_close(result["grads"], want["grads"], grads_tolerance, "gradient ")
    # Adam's first step is about lr * sign(grad): a rounding difference in a gradient near
    # Adam's eps moves its weight by up to lr * (difference / eps); what each element's two
    # gradients explain is allowed, nothing more
    assert_adam_step_close(result["weights"], want["weights"], result["grads"],
                           want["grads"], **json.loads(want["optim"]))


@pytest.mark.skipif(not HAVE_GLOO, reason="torch build without gloo")
def test_two_groups_of_two_match_one_process(tmp_path):
    """4 ranks: 2 data-parallel groups (half the rows each) of 2 sequence-parallel ranks;
    loss normalisers and metrics count the 2 data-parallel ranks, FSDP2 shards over 4."""
    want = actor_update([])
    want_metrics = json.loads(want["metrics"])
    results = run_ranks(tmp_path, "actor", world=4)
    for rank, result in enumerate(results):
        assert result["exchanges"] == 2 * 3 * 4  # one micro-batch per pass here
        metrics = json.loads(result["metrics"])
        check_metrics(metrics, want_metrics, ("actor/pg_loss", "actor/grad_norm",
                                              "actor/entropy", "actor/ppo_kl"),
                      f"rank {rank} ")
        share = slice(rank // 2 * 2, rank // 2 * 2 + 2)
        assert_close(result["old_log_probs"], want["old_log_probs"][share],
                     outputs_tolerance(want["old_log_probs"]), f"rank {rank} old_log_probs")
        check_update(result, want)


def test_heads_must_divide_by_the_size():
    with pytest.raises(ConfigError, match="ulysses_sequence_parallel_size=3 must divide"):
        ulysses.check_model(tiny_lm(), 3, "actor_rollout_ref.actor.ulysses_sequence_parallel_"
                            "size")


def test_a_single_rank_cannot_split():
    from siirl.engine.fsdp.placement import placement

    with pytest.raises(ConfigError, match="must divide the number of workers"):
        placement(None, "actor", 2, "actor_rollout_ref.actor.ulysses_sequence_parallel_size")


def test_the_causal_mask_keeps_packed_sequences_apart():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0]])
    forward = ulysses.UlyssesForward(ulysses.SequenceParallel(None, 2, 0), positions)
    mask = forward.causal_mask()[0, 0]
    seq = torch.tensor([0, 0, 0, 1, 1, 2])
    index = torch.arange(6)
    want = (seq[:, None] == seq[None, :]) & (index[None, :] <= index[:, None])
    assert torch.equal(mask, want)


def test_the_split_roles_lay_their_rows_out_per_group():
    """The actor, the reference (in the actor's groups) and the critic read one row share
    per Ulysses group; the rollout and reward stay one share per worker."""
    from siirl.dag_worker.walk.layouts import node_layouts, sequence_parallel_sizes
    from siirl.data_coordinator.data_buffer import Layout
    from siirl.execution.dag.builtin_pipelines import ppo_pipeline
    from siirl.params.typed import to_typed

    config = to_typed({
        "actor_rollout_ref": {"actor": {"ulysses_sequence_parallel_size": 2}},
        "critic": {"ulysses_sequence_parallel_size": 4}})
    graph = ppo_pipeline()
    layouts = node_layouts(graph, config, tuple(range(4)))
    want = {"actor": Layout(tuple(range(4)), 2), "reference": Layout(tuple(range(4)), 2),
            "critic": Layout(tuple(range(4)), 4), "rollout": Layout(tuple(range(4)), 1)}
    for node_id, layout in layouts.items():
        role = graph.nodes[node_id].node_role.value
        if role in want:
            assert layout == want[role], node_id
    assert sequence_parallel_sizes(config) == (2, 4)
    with pytest.raises(ConfigError, match="ulysses_sequence_parallel_size=. must divide"):
        node_layouts(graph, config, (0, 1, 2))


PACKED = ["actor_rollout_ref.model.use_remove_padding=true",
          "critic.model.use_remove_padding=true"]


@pytest.mark.parametrize("overrides,match", [
    (["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
     r"actor\.ulysses_sequence_parallel_size=2.*use_remove_padding=true"),
    (["critic.ulysses_sequence_parallel_size=2", "algorithm.adv_estimator=gae"],
     r"critic\.ulysses_sequence_parallel_size=2.*critic\.model\.use_remove_padding=true"),
    (PACKED + ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
               "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1"],
     r"ref\.ulysses_sequence_parallel_size=1.*actor's sequence-parallel groups"),
    (PACKED + ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
               "actor_rollout_ref.actor.strategy=megatron"],
     r"actor\.ulysses_sequence_parallel_size=2.*tensor_model_parallel_size and "
     r"sequence_parallel=true"),
])
def test_settings_ulysses_cannot_serve_stop_the_run(overrides, match):
    from siirl.params.parser import parse_config

    with pytest.raises(ConfigError, match=match):
        parse_config(overrides)


def test_packed_split_settings_are_read():
    from siirl.params.parser import parse_config

    config = parse_config(PACKED + ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                                    "critic.ulysses_sequence_parallel_size=2"])
    assert config.actor_rollout_ref.ref.ulysses_sequence_parallel_size == 2  # the actor's
