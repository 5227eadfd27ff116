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
                sequence_parallel: bool = False) -> None:
    """Every check of the module doc at this process's TP size (assertions on every rank;
    the peft model, the same on every rank, is the reference)."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from peft import PeftModel, get_peft_model, set_peft_model_state_dict

    from siirl.engine.megatron import lora
    from siirl.engine.megatron.bridge import load_hf_weights
    from siirl.engine.megatron.model import build_gpt_model, forward_logits
    from siirl.engine.megatron.sequence_parallel import sum_sequence_parallel_grads

    hf = tiny_hf_model(family)
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

    reference = get_peft_model(copy.deepcopy(hf), lora.peft_config(settings))
    state = lora.adapter_state(megatron)
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

    trained = lora.adapter_state(megatron)
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
        merged = dict(kv for bucket in lora.iter_merged_hf_weights(megatron, hf.config, 1 << 20)
                      for kv in bucket)
        exported = copy.deepcopy(hf)
        exported.load_state_dict(merged, strict=False)
        assert_logprobs_close(logits, _peft_logits(exported, batch), attention_mask,
                              hf.config, "merged HF export")
        for name, tensor in hf.state_dict().items():  # the base weights stayed frozen
            if name in merged and not any(p in name for p in settings.targets):
                assert torch.equal(merged[name], tensor), name

    if tmp_dir is not None and dist.get_rank() == 0:  # peft loads the saved adapters
        lora.peft_config(settings).save_pretrained(tmp_dir)
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
    lora.load_adapter_state(fresh, trained)
    with torch.no_grad():
        assert torch.equal(forward_logits(fresh, input_ids, position_ids, attention_mask),
                           logits)


@pytest.mark.parametrize("family,targets", [("llama", "all-linear"),
                                            ("qwen2", ["q_proj", "v_proj", "down_proj"])])
def test_lora_matches_peft_at_tp1(family, targets, gloo_world_of_one, tmp_path):  # noqa: F811
    lora_checks(family, targets, str(tmp_path))


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
