"""Starting a megatron model from a megatron-core distributed checkpoint
(``<role>.megatron.use_dist_checkpointing``), on CPU over gloo.

One 2-rank spawn writes a checkpoint of a tiny HF model at TP=1 (two data-parallel replicas)
and loads it at TP=1, TP=2, PP=2 and PP=2 x VPP=2; writes one at TP=2 and loads it at PP=2
and TP=1. At every layout the loaded stage's weights equal, bit for bit, those the bridge
builds from the HF weights at that layout (so the log-probs are the HF build's), and where
one process runs the whole model (TP=1, TP=2) the log-probs are compared too: equal to the
HF build's within 1e-6 and to transformers' within float32 rounding. Llama's vocabulary
(101) is padded to 102 at TP=2: megatron fills the rows it lacks with zeros. Bad paths, and
a checkpoint of another architecture, give an error naming the key and the path. A
Qwen3-MoE checkpoint moves between expert layouts (expert TP 1 or TP, EP 1 or 2) likewise.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from siirl_spawn import finish_rank, join_spawned, start_gloo_rank
from siirl_suites import megatron_full

pytest.importorskip("megatron.core")

from test_megatron_bridge import (  # noqa: E402
    assert_logprobs_close,
    free_port,
    init_megatron,
    left_padded_batch,
    tiny_hf_model,
)

from siirl.errors import ConfigError  # noqa: E402

KEY = "actor_rollout_ref.actor.megatron"
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning:megatron"),
              pytest.mark.filterwarnings("ignore:Apex is not installed:UserWarning")]


def _build(hf, path=None):
    from siirl.engine.megatron.setup import build_megatron_model

    start = None if path is None else (KEY, path)
    return build_megatron_model(hf, torch.device("cpu"), dist_checkpoint=start).eval()


def _assert_same_weights(loaded, built, layout: str) -> None:
    want = {k: v for k, v in built.state_dict().items() if isinstance(v, torch.Tensor)
            and not k.endswith("_extra_state")}
    got = {k: v for k, v in loaded.state_dict().items() if k in want}
    assert got.keys() == want.keys(), layout
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), f"{layout}: {name} differs"


def _assert_same_logprobs(loaded, built, hf, layout: str) -> None:
    from siirl.engine.megatron.model import forward_logits

    input_ids, attention_mask, position_ids = left_padded_batch(hf.config.vocab_size)
    with torch.no_grad():
        got = forward_logits(loaded, input_ids, position_ids, attention_mask)
        want = forward_logits(built, input_ids, position_ids, attention_mask)
        ref = hf(input_ids=input_ids, attention_mask=attention_mask,
                 position_ids=position_ids).logits
    diff = (got.log_softmax(-1) - want.log_softmax(-1))[attention_mask.bool()].abs().max()
    assert diff <= 1e-6, f"{layout}: log-probs differ from the HF build's by {diff}"
    assert_logprobs_close(got, ref, attention_mask, hf.config, layout)


def _at(tp: int, pp: int, hf, path: str, save_to: str | None = None, vpp: int = 1) -> None:
    """Load ``path`` at TP x PP (x VPP chunks) and compare with the HF build there;
    optionally save it."""
    from megatron.core import parallel_state

    from siirl.engine.megatron.dist_checkpoint import save_model

    init_megatron(tp=tp, pp=pp, vpp=vpp)
    built, loaded = _build(hf), _build(hf, path)
    layout = f"{os.path.basename(path)} loaded at TP={tp} PP={pp} VPP={vpp}"
    _assert_same_weights(loaded, built, layout)
    if pp == 1:
        _assert_same_logprobs(loaded, built, hf, layout)
    if save_to is not None:
        save_model(loaded, save_to)
    parallel_state.destroy_model_parallel()


def rank_main(rank: int, world_size: int, port: int, root: str) -> None:

    from megatron.core import parallel_state

    from siirl.engine.megatron.dist_checkpoint import save_model

    start_gloo_rank(rank, world_size, port, 120)
    for family in ("llama", "qwen2"):  # untied head; tied embeddings (PP=2: a copy)
        hf = tiny_hf_model(family, num_layers=4)
        tp1, tp2 = os.path.join(root, f"{family}_tp1"), os.path.join(root, f"{family}_tp2")
        init_megatron(tp=1, pp=1)
        save_model(_build(hf), tp1)  # what tools/megatron_dist_checkpoint.py writes
        parallel_state.destroy_model_parallel()
        _at(1, 1, hf, tp1)
        _at(2, 1, hf, tp1, save_to=tp2)
        _at(1, 2, hf, tp1)
        _at(1, 2, hf, tp2)
        _at(1, 2, hf, tp1, vpp=2)  # two chunks of one layer per rank
        _at(1, 1, hf, tp2)
    init_megatron(tp=1, pp=1)  # another architecture's checkpoint: Qwen2's qkv bias, tied
    with pytest.raises(ConfigError, match=f"{KEY}.dist_checkpointing_path=.* does not fit"):
        _build(tiny_hf_model("llama", num_layers=4), os.path.join(root, "qwen2_tp1"))
    parallel_state.destroy_model_parallel()
    finish_rank()


def test_dist_checkpoint_loads_at_any_layout_like_the_hf_build(tmp_path):
    context = mp.start_processes(rank_main, args=(2, free_port(), str(tmp_path)), nprocs=2,
                                 join=False, start_method="spawn")
    join_spawned(context, "the 2-rank megatron dist-checkpoint run")


@pytest.mark.parametrize("path,said", [(None, "needs"), ("/nonexistent/mcore", "does not exist"),
                                       ("EMPTY", "holds no megatron distributed checkpoint")])
def test_a_bad_path_names_the_key_and_the_path(path, said, tmp_path):
    from siirl.engine.megatron.dist_checkpoint import checkpoint_dir

    path = str(tmp_path) if path == "EMPTY" else path
    with pytest.raises(ConfigError) as err:
        checkpoint_dir(path, KEY)
    assert said in str(err.value) and f"{KEY}.dist_checkpointing_path" in str(err.value)
    if path is not None:
        assert repr(path) in str(err.value)


@megatron_full
def test_a_run_starts_from_a_checkpoint_at_another_layout(tmp_path):
    """The weights of a 2-step megatron run (TP=1, one worker) start a new run at TP=2 on two
    Ray workers through use_dist_checkpointing, with model.path still the untrained built-in
    model (its config and tokenizer): its first steps equal those of a run started from the
    HF export of the same weights (the rollout generates with the checkpoint's weights too)."""
    from test_megatron_engine import MEGATRON, assert_close_steps, ray_workers, steps, train

    trained = tmp_path / "trained"
    train(trained, *MEGATRON, "trainer.total_training_steps=2", "trainer.save_freq=2")
    ckpt = trained / "global_step_2" / "actor"
    two = ("trainer.total_training_steps=2", "trainer.save_freq=-1")
    from_hf = tmp_path / "from_hf"
    train(from_hf, *MEGATRON, *two, f"actor_rollout_ref.model.path={ckpt / 'huggingface'}")
    overrides, env = ray_workers(2)
    from_ckpt = tmp_path / "from_ckpt"
    train(from_ckpt, *MEGATRON, *two, *overrides,
          "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
          f"{KEY}.use_dist_checkpointing=true", f"{KEY}.dist_checkpointing_path={ckpt}",
          env=env)
    want, untrained = steps(from_hf), steps(trained)
    assert_close_steps(steps(from_ckpt), want,
                       ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean"))
    assert want[1]["actor/entropy"] != untrained[1]["actor/entropy"]  # other weights indeed


@pytest.mark.parametrize("role", [KEY, "actor_rollout_ref.ref.megatron", "critic.megatron"])
def test_use_dist_checkpointing_without_a_path_is_refused_and_with_one_accepted(role, tmp_path):
    from siirl.params.parser import parse_config

    run = ["actor_rollout_ref.actor.strategy=megatron", "critic.strategy=megatron",
           "algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=true"]
    with pytest.raises(ConfigError) as err:
        parse_config(run + [f"{role}.use_dist_checkpointing=true"], validate=True)
    assert f"without {role}.dist_checkpointing_path" in str(err.value), str(err.value)
    config = parse_config(run + [f"{role}.use_dist_checkpointing=true",
                                 f"{role}.dist_checkpointing_path={tmp_path}"], validate=True)
    section = config
    for part in role.split("."):
        section = getattr(section, part)
    assert section.use_dist_checkpointing and section.dist_checkpointing_path == str(tmp_path)


@megatron_full
def test_ppo_with_every_role_from_the_tool_checkpoint_trains_like_from_hf(tmp_path):
    """tools/megatron_dist_checkpoint.py converts the built-in model; PPO with the actor,
    the reference (KL loss) and the critic (its transformer; the value head starts from its
    seed) all loading it trains like PPO from the HF weights."""
    import subprocess
    import sys

    from test_megatron_engine import MEGATRON, PPO, PPO_KEYS, assert_close_steps, steps, train

    ckpt = tmp_path / "mcore"
    subprocess.run([sys.executable, "tools/megatron_dist_checkpoint.py", "builtin:tiny-arith",
                    str(ckpt)], check=True, capture_output=True, timeout=300)
    run = [*PPO, *MEGATRON, "critic.strategy=megatron", "actor_rollout_ref.actor.use_kl_loss=true"]
    train(tmp_path / "hf", *run)
    starts = [f"{role}.{key}" for role in (KEY, "actor_rollout_ref.ref.megatron", "critic.megatron")
              for key in ("use_dist_checkpointing=true", f"dist_checkpointing_path={ckpt}")]
    train(tmp_path / "ckpt", *run, *starts)
    assert_close_steps(steps(tmp_path / "ckpt"), steps(tmp_path / "hf"),
                       PPO_KEYS + ("actor/kl_loss",))



def _moe_at(tp: int, expert_tp: int, ep: int, hf, path: str | None,
            save_to: str | None = None) -> None:
    """Load the MoE checkpoint ``path`` at TP x expert TP x EP (sequence parallel under TP,
    which megatron's MoE layer needs) and compare with the HF build there; save the loaded
    model (``path`` None: the HF build) to ``save_to``."""
    from megatron.core import parallel_state, tensor_parallel

    from siirl.engine.megatron.cpu_compat import enable_cpu_mode
    from siirl.engine.megatron.dist_checkpoint import save_model
    from siirl.engine.megatron.rank_order import initialize_parallel_state
    from siirl.engine.megatron.setup import build_megatron_model

    enable_cpu_mode()
    initialize_parallel_state(tp, 1, ep=ep, etp=expert_tp)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    loaded = built = build_megatron_model(hf, torch.device("cpu"), tp > 1).eval()
    if path is not None:
        loaded = build_megatron_model(hf, torch.device("cpu"), tp > 1,
                                      dist_checkpoint=(KEY, path)).eval()
        layout = f"{os.path.basename(path)} loaded at TP={tp} expert TP={expert_tp} EP={ep}"
        _assert_same_weights(loaded, built, layout)
        _assert_same_logprobs(loaded, built, hf, layout)
    if save_to is not None:
        save_model(loaded, save_to)
    parallel_state.destroy_model_parallel()


def moe_rank_main(rank: int, world_size: int, port: int, root: str) -> None:
    from test_megatron_bridge_qwen3_moe import tiny_model

    start_gloo_rank(rank, world_size, port, 120)
    hf = tiny_model("qwen3_moe")
    one, whole = os.path.join(root, "moe_tp1"), os.path.join(root, "moe_tp2_etp1_ep2")
    _moe_at(1, 1, 1, hf, None, save_to=one)
    _moe_at(2, 1, 2, hf, one, save_to=whole)  # whole experts, two per rank
    _moe_at(1, 1, 1, hf, whole)
    _moe_at(2, 2, 1, hf, whole)  # every expert split over TP
    _moe_at(2, 1, 1, hf, whole)  # whole experts on both TP ranks
    finish_rank()


def test_moe_dist_checkpoint_loads_at_another_expert_layout(tmp_path):
    """A Qwen3-MoE checkpoint written at TP 1 loads at TP 2 x expert TP 1 x EP 2 and what
    that writes loads at TP 1, at TP 2 with experts split over TP and at TP 2 with whole
    experts on both ranks: weights bit-equal to the HF build there."""
    context = mp.start_processes(moe_rank_main, args=(2, free_port(), str(tmp_path)),
                                 nprocs=2, join=False, start_method="spawn")
    join_spawned(context, "the 2-rank megatron MoE dist-checkpoint run")
