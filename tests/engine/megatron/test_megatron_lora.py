"""LoRA on the megatron GPT (``siirl.engine.megatron.lora``), checked against peft's LoRA on
the same HF model: at init (B = 0) the log-probs are the base model's bit for bit; after two
SGD steps on the same batch the adapters, the log-probs and the merged HF export equal
peft's within float32 rounding; the adapters saved in peft's format load with peft on the
HF model and score like the megatron model; adapters off is the base model. The same
checks run at TP=2 over gloo (two spawned ranks), where the adapters are split like the
base weights, and at TP=2 with sequence parallelism, where the adapters read and write
sequence slices and the replicated adapters' gradients are summed over TP.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.multiprocessing as mp

from siirl_spawn import finish_rank, join_spawned, start_gloo_rank

pytest.importorskip("megatron.core")
peft = pytest.importorskip("peft")

from test_megatron_bridge import (  # noqa: E402
    assert_grads_close,
    assert_logprobs_close,
    expected_hf,
    free_port,
    gloo_world_of_one,  # noqa: F401  (fixture)
    init_megatron,
    left_padded_batch,
    tiny_hf_model,
    token_loss,
)

from siirl.engine.megatron.lora import (  # noqa: E402
    ALL_LINEAR,
    LoraSettings,
    target_projections,
)
from siirl.errors import ConfigError  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning:megatron"),
              pytest.mark.filterwarnings("ignore:Apex is not installed:UserWarning")]
STEPS, LR = 2, 0.5


def _peft_logits(model, batch):
    input_ids, attention_mask, position_ids = batch
    return model(input_ids=input_ids, attention_mask=attention_mask,
                 position_ids=position_ids).logits


def lora_checks(family: str, targets, tmp_dir: str | None = None,
                sequence_parallel: bool = False, hf=None) -> None:
    """Every check of the module doc at this process's TP size (assertions on every rank;
    the peft model, the same on every rank, is the reference)."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from peft import PeftModel, get_peft_model, set_peft_model_state_dict

    from siirl.engine.megatron import lora, lora_state
    from siirl.engine.megatron.bridge import load_hf_weights
    from siirl.engine.megatron.model import build_gpt_model, forward_logits
    from siirl.engine.megatron.sequence_parallel import sum_sequence_parallel_grads

    hf = tiny_hf_model(family) if hf is None else hf
    settings = LoraSettings(rank=4, alpha=8.0, targets=target_projections(targets))
    megatron = build_gpt_model(hf.config, sequence_parallel=sequence_parallel)
    load_hf_weights(megatron, hf.state_dict(), hf.config)
    batch = left_padded_batch(hf.config.vocab_size)
    input_ids, attention_mask, position_ids = batch
    base = forward_logits(megatron, input_ids, position_ids, attention_mask).detach()
    lora.add_adapters(megatron, hf.config, settings, seed=3)
    trainable = [p for p in megatron.parameters() if p.requires_grad]
    assert trainable and all(".lora." in n for n, p in megatron.named_parameters()
                             if p.requires_grad)
    got = forward_logits(megatron, input_ids, position_ids, attention_mask)
    assert torch.equal(got, base), "B = 0: the adapted model is the base model"

    reference = get_peft_model(copy.deepcopy(hf), lora_state.peft_config(settings))
    state = lora_state.adapter_state(megatron)
    assert set_peft_model_state_dict(reference, state).unexpected_keys == []
    assert all(float(t.abs().max()) == 0 for k, t in state.items() if "lora_B" in k)

    ours = torch.optim.SGD(trainable, lr=LR)
    theirs = torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=LR)
    for _ in range(STEPS):
        for optimizer in (ours, theirs):
            optimizer.zero_grad()
        token_loss(forward_logits(megatron, input_ids, position_ids, attention_mask),
                   input_ids, attention_mask).backward()
        token_loss(_peft_logits(reference, batch), input_ids, attention_mask).backward()
        summed = [p for p in trainable if getattr(p, "sequence_parallel", False)]
        assert bool(summed) == sequence_parallel
        partial = [p.grad.clone() for p in summed]
        sum_sequence_parallel_grads(megatron, parallel_state.get_tensor_model_parallel_group()
                                    if sequence_parallel else None)
        # each rank's replicated-adapter gradient covered its sequence slice only
        assert all(not torch.allclose(g, p.grad) for g, p in zip(partial, summed, strict=True)
                   if float(p.grad.abs().max()) > 0)
        ours.step()
        theirs.step()

    trained = lora_state.adapter_state(megatron)
    want = peft.get_peft_model_state_dict(reference)
    assert sorted(trained) == sorted(want)
    for key in want:  # the adapters went through the same two backward passes
        assert_grads_close(trained[key], want[key], attention_mask, hf.config, key)
    assert any(float(t.abs().max()) > 0 for k, t in trained.items() if "lora_B" in k)
    with torch.no_grad():
        logits = forward_logits(megatron, input_ids, position_ids, attention_mask)
        assert_logprobs_close(logits, _peft_logits(reference, batch), attention_mask,
                              hf.config, "trained LoRA vs peft")
        with lora.adapters_disabled(megatron):
            off = forward_logits(megatron, input_ids, position_ids, attention_mask)
        assert torch.equal(off, base), "adapters off: the base model (the reference)"

        # the rollout's weights: merged through the bridge, loaded into a plain HF model
        merged = dict(kv for bucket in lora_state.iter_merged_hf_weights(
            megatron, hf.config, 1 << 20) for kv in bucket)
        exported = copy.deepcopy(hf)
        exported.load_state_dict(merged, strict=False)
        assert_logprobs_close(logits, _peft_logits(exported, batch), attention_mask,
                              hf.config, "merged HF export")
        for name, tensor in hf.state_dict().items():  # the base weights stayed frozen
            if name in merged and not any(p in name for p in settings.targets):
                assert torch.equal(merged[name], tensor), name

    if tmp_dir is not None and dist.get_rank() == 0:  # peft loads the saved adapters
        lora_state.peft_config(settings).save_pretrained(tmp_dir)
        from safetensors.torch import save_file

        save_file(trained, f"{tmp_dir}/adapter_model.safetensors")
        loaded = PeftModel.from_pretrained(copy.deepcopy(hf), tmp_dir).eval()
        with torch.no_grad():
            assert_logprobs_close(logits, _peft_logits(loaded, batch), attention_mask,
                                  hf.config, "peft-loaded adapters")
    # a resumed run: the adapters read back exactly
    fresh = build_gpt_model(hf.config, sequence_parallel=sequence_parallel)
    load_hf_weights(fresh, hf.state_dict(), hf.config)
    lora.add_adapters(fresh, hf.config, settings, seed=99)
    lora_state.load_adapter_state(fresh, trained)
    with torch.no_grad():
        assert torch.equal(forward_logits(fresh, input_ids, position_ids, attention_mask),
                           logits)


@pytest.mark.parametrize("family,targets", [("llama", "all-linear"),
                                            ("qwen2", ["q_proj", "v_proj", "down_proj"])])
def test_lora_matches_peft_at_tp1(family, targets, gloo_world_of_one, tmp_path):  # noqa: F811
    lora_checks(family, targets, str(tmp_path))


ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_lora_on_a_mixture_of_experts_adapts_its_attention_like_peft(
        family, gloo_world_of_one, tmp_path):  # noqa: F811
    """On an MoE model the attention projections take adapters as on a dense one (the
    experts stay frozen and whole); its MLP projections are refused at model build."""
    from test_megatron_bridge_qwen3_moe import tiny_model

    from siirl.engine.megatron import lora
    from siirl.engine.megatron.model import build_gpt_model

    lora_checks(family, ATTENTION, str(tmp_path), hf=tiny_model(family))
    hf = tiny_model(family)
    with pytest.raises(ConfigError, match="MLP projections .gate_proj, up_proj, down_proj. of "
                                          "a mixture-of-experts model"):
        lora.add_adapters(build_gpt_model(hf.config), hf.config,
                          LoraSettings(rank=4, alpha=8.0, targets=target_projections(
                              "all-linear")))


def test_target_names_are_peft_names():
    assert target_projections("all-linear") == ALL_LINEAR
    assert target_projections(["v_proj", "q_proj"]) == ("q_proj", "v_proj")
    with pytest.raises(ConfigError, match="lm_head"):
        target_projections(["q_proj", "lm_head"])


def _rank_main(rank: int, world_size: int, port: int) -> None:

    from megatron.core import parallel_state

    start_gloo_rank(rank, world_size, port)
    init_megatron(tp=2, pp=1)
    lora_checks("llama", "all-linear")
    lora_checks("qwen2", ["k_proj", "o_proj", "up_proj"])
    parallel_state.destroy_model_parallel()
    finish_rank()


def test_lora_matches_peft_at_tp2_over_gloo():
    """TP=2: the split adapters train like peft's (so like TP=1) within float32 rounding."""
    context = mp.start_processes(_rank_main, args=(2, free_port()), nprocs=2, join=False,
                                 start_method="spawn")
    join_spawned(context, "megatron LoRA TP=2")


def _sp_rank_main(rank: int, world_size: int, port: int) -> None:
    from megatron.core import parallel_state

    start_gloo_rank(rank, world_size, port)
    init_megatron(tp=2, pp=1)
    lora_checks("llama", "all-linear", sequence_parallel=True)
    lora_checks("qwen2", ["q_proj", "o_proj", "gate_proj", "down_proj"],
                sequence_parallel=True)
    parallel_state.destroy_model_parallel()
    finish_rank()


def test_lora_matches_peft_at_tp2_with_sequence_parallel():
    """TP=2, sequence_parallel=true: each rank's adapters see half of the sequence; trained,
    merged, saved and read back they equal peft's within float32 rounding."""
    context = mp.start_processes(_sp_rank_main, args=(2, free_port()), nprocs=2, join=False,
                                 start_method="spawn")
    join_spawned(context, "megatron LoRA TP=2 with sequence parallelism")


def _initial_adapters(family: str, targets) -> dict:
    """The adapters ``add_adapters`` draws on one pipeline stage (seed 3)."""
    from siirl.engine.megatron import lora, lora_state
    from siirl.engine.megatron.setup import build_megatron_model

    hf = tiny_hf_model(family, num_layers=4)
    model = build_megatron_model(hf, torch.device("cpu"))
    lora.add_adapters(model, hf.config, LoraSettings(4, 8.0, target_projections(targets)),
                      seed=3)
    return lora_state.adapter_state(model)


def _pp_checks(family: str, targets, tmp_dir: str, one_stage: dict) -> None:
    """At PP=2 (each stage its layers' adapters) against peft's LoRA on the HF model: the
    adapters start as on one stage (``one_stage``); two SGD steps through megatron's
    pipeline schedule give peft's adapters and log-probs; the adapter state and the merged
    HF export gather every stage's; the adapters written in peft's format by one rank read
    back into a fresh pipeline exactly."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from peft import get_peft_model, set_peft_model_state_dict
    from test_megatron_pp_gloo import RESPONSE, logprob_tolerance, split_micro_batches
    from test_megatron_pp_gloo import _batch as response_batch

    from siirl.engine.megatron import lora, lora_state
    from siirl.engine.megatron.lora_checkpoint import read_adapter, write_adapter
    from siirl.engine.megatron.pipeline import pipeline_logprob_step
    from siirl.engine.megatron.setup import build_megatron_model
    from siirl.engine.models.logprob import logprobs_from_logits
    from siirl_numerics import assert_close

    hf = tiny_hf_model(family, num_layers=4)
    last = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
    settings = LoraSettings(rank=4, alpha=8.0, targets=target_projections(targets))
    input_ids, attention_mask, position_ids = batch = response_batch(hf.config.vocab_size)
    micro_batches = split_micro_batches(input_ids, attention_mask, position_ids)
    rows = micro_batches[0]["input_ids"].shape[0]
    response_mask = attention_mask[:, -RESPONSE:].float()

    def log_probs(model):  # forward only; on the last stage, else None
        out = pipeline_logprob_step(model, micro_batches, RESPONSE, forward_only=True)
        return torch.cat([o["log_probs"] for o in out]) if last else None

    def loss_of(log_probs_, mask):
        return -(log_probs_ * mask).sum() / response_mask.sum()

    stage = build_megatron_model(hf, torch.device("cpu"))
    base = log_probs(stage)
    lora.add_adapters(stage, hf.config, settings, seed=3)
    state = lora_state.adapter_state(stage)  # every stage's adapters on every rank
    assert sorted(state) == sorted(one_stage)
    assert all(torch.equal(state[key], one_stage[key]) for key in state), "same init"
    reference = get_peft_model(copy.deepcopy(hf), lora_state.peft_config(settings))
    assert sorted(state) == sorted(peft.get_peft_model_state_dict(reference))
    assert set_peft_model_state_dict(reference, state).unexpected_keys == []

    trainable = [p for p in stage.parameters() if p.requires_grad]
    ours = torch.optim.SGD(trainable, lr=LR)
    theirs = torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=LR)
    for _ in range(STEPS):
        for optimizer in (ours, theirs):
            optimizer.zero_grad()
        pipeline_logprob_step(stage, micro_batches, RESPONSE, loss_fn=lambda i, lp: loss_of(
            lp, response_mask[i * rows:(i + 1) * rows]))
        want, _ = logprobs_from_logits(_peft_logits(reference, batch), input_ids, RESPONSE)
        loss_of(want, response_mask).backward()
        ours.step()
        theirs.step()

    trained = lora_state.adapter_state(stage)
    want = peft.get_peft_model_state_dict(reference)
    assert sorted(trained) == sorted(want)
    for key in want:
        assert_grads_close(trained[key], want[key], attention_mask, hf.config, key)
    with torch.no_grad():
        want, _ = logprobs_from_logits(_peft_logits(reference, batch), input_ids, RESPONSE)
        got = log_probs(stage)
        if last:
            assert_close(got, want, logprob_tolerance(hf.config, want), "trained LoRA vs peft")
        with lora.adapters_disabled(stage):
            off = log_probs(stage)
        assert not last or torch.equal(off, base), "adapters off: the base model"
        merged = dict(kv for bucket in lora_state.iter_merged_hf_weights(
            stage, hf.config, 1 << 20) for kv in bucket)  # both stages' tensors everywhere
        exported = copy.deepcopy(hf)
        assert sorted(merged) == sorted(expected_hf(hf))
        exported.load_state_dict(merged, strict=False)
        from_export, _ = logprobs_from_logits(_peft_logits(exported, batch), input_ids, RESPONSE)
        assert_close(from_export, want, logprob_tolerance(hf.config, want), "merged HF export")

    if dist.get_rank() == 0:
        write_adapter(tmp_dir, settings, trained)
    dist.barrier()
    fresh = build_megatron_model(hf, torch.device("cpu"))
    lora.add_adapters(fresh, hf.config, settings, seed=99)
    with pytest.raises(KeyError, match="unexpected"):  # a layer no stage holds
        lora_state.load_adapter_state(fresh, {**trained, "model.layers.9.lora_A.weight":
                                              torch.zeros(1)})
    lora_state.load_adapter_state(fresh, read_adapter(tmp_dir))
    with torch.no_grad():
        again = log_probs(fresh)
    assert not last or torch.equal(again, got), "adapters read back"


def _pp_rank_main(rank: int, world_size: int, port: int, vpp: int, tmp_dir: str) -> None:
    from megatron.core import parallel_state

    start_gloo_rank(rank, world_size, port)
    cases = [("llama", "all-linear"), ("qwen2", ["q_proj", "v_proj", "down_proj"])]
    init_megatron(tp=1, pp=1)
    one_stage = [_initial_adapters(family, targets) for family, targets in cases]
    parallel_state.destroy_model_parallel()
    init_megatron(tp=1, pp=2, vpp=vpp)
    for (family, targets), initial in zip(cases, one_stage, strict=True):
        _pp_checks(family, targets, f"{tmp_dir}/{family}", initial)
    parallel_state.destroy_model_parallel()
    finish_rank()


@pytest.mark.parametrize("vpp", [1, 2], ids=["pp2", "pp2-vpp2"])
def test_lora_matches_peft_with_pipeline_stages(vpp, tmp_path):
    """PP=2 on two gloo ranks (vpp=2: two one-layer chunks per rank): trained through the
    pipeline schedule, gathered from both stages and read back, the adapters equal peft's."""
    context = mp.start_processes(_pp_rank_main, args=(2, free_port(), vpp, str(tmp_path)),
                                 nprocs=2, join=False, start_method="spawn")
    join_spawned(context, f"megatron LoRA PP=2 (vpp={vpp})")
