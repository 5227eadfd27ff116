"""LoRA through peft (actor_rollout_ref.model.lora_rank > 0) on the fsdp actor, in one
process: only the adapters train; the reference is the actor's own module with its adapters
off, equal to the base model; rollouts that receive weights get the merged weights under the
base model's names; checkpoints hold the adapters only. FSDP2 over two gloo ranks:
test_lora_fsdp2_gloo.py.
"""

import copy
import json
import os
import sys

import pytest
import torch
from siirl_lora_testlib import (
    BASE,
    LORA_RANK,
    PROMPT,
    RESPONSE,
    lora_actor,
    rollout_batch,
    tiny_model,
)

from siirl.engine.common.checkpoint import EXTRA_FILE, OPTIMIZER_FILE, load_tensors
from siirl.engine.common.weight_sync import copy_into
from siirl.engine.fsdp.engines import fsdp_actor, fsdp_reference
from siirl.engine.models import lora
from siirl.engine.models.logprob import response_logprobs
from siirl.errors import ConfigError
from siirl.params.parser import parse_config
from siirl_numerics import assert_close, rounding, scale_of, transformer_terms

peft = pytest.importorskip("peft", reason='peft is not installed: pip install '
                                          '"siirl-engine[lora]"')


@pytest.fixture(autouse=True)
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors; the test machine's cores are shared
    yield
    torch.set_num_threads(threads)


def logprob_tolerance(model, want):
    """Two forwards of the same weights in another summation order (merged vs adapters on,
    another model object): float32 rounding of the tiny Llama's reductions plus each
    linear layer's rank-r LoRA product (7 per layer)."""
    config = model.config
    terms = transformer_terms(config, PROMPT + RESPONSE) + \
        7 * config.num_hidden_layers * LORA_RANK
    return rounding(torch.float32, terms, scale_of(want), want.numel())


def assert_logprobs_close(got_model, want_model, batch, what):
    want = logprobs_of(want_model, batch)
    assert_close(logprobs_of(got_model, batch), want, logprob_tolerance(want_model, want),
                 what)


def logprobs_of(model, batch):
    """Log-probs of the responses (0 at padding, as the engines leave them)."""
    with torch.no_grad():
        log_probs = response_logprobs(model.eval(), batch["input_ids"],
                                      batch["attention_mask"], batch["position_ids"],
                                      RESPONSE)[0]
    return log_probs * batch["response_mask"]


def trained_actor(*overrides):
    """(base model before training, config, actor after one update)."""
    base = tiny_model()
    config, actor = lora_actor(*overrides, module=copy.deepcopy(base))
    batch = actor.compute_log_prob(rollout_batch()).batch
    batch.set("ref_log_prob", batch["old_log_probs"].clone())
    actor.update_policy(batch)
    return base, config, actor


def test_only_the_adapters_train():
    base, _, actor = trained_actor()
    module = actor.module
    assert lora.is_lora(module)
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    optimized = {id(p) for group in actor.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in module.parameters() if p.requires_grad}
    # every linear layer but the output head got adapters (all-linear)
    assert len(trainable) == 2 * 7 * 2  # A and B x 7 projections x 2 layers
    # the update moved the adapters and left the base weights bitwise as loaded
    for name, param in module.named_parameters():
        if not param.requires_grad:
            key = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            assert torch.equal(param, base.state_dict()[key]), name
    assert any(p.abs().sum() > 0 for n, p in module.named_parameters() if ".lora_B." in n)


def test_reference_is_the_base_model_without_a_copy():
    base, config, actor = trained_actor()
    reference = fsdp_reference(config, actor=actor)
    assert reference.module is actor.module  # the actor's module, not a copy
    batch = rollout_batch(seed=5)
    want = logprobs_of(base, batch)
    got = reference.compute_ref_log_prob(batch.clone()).batch["ref_log_prob"]
    assert torch.equal(got, want)  # bitwise: the adapters are off, the base is untouched
    policy = actor.compute_log_prob(batch.clone()).batch["old_log_probs"]
    assert not torch.allclose(policy, want)  # the trained adapters act outside it
    assert all(p.requires_grad for n, p in actor.module.named_parameters() if "lora_" in n)


def test_reference_equals_base_before_training():
    base = tiny_model()
    config, actor = lora_actor(module=copy.deepcopy(base))
    with torch.no_grad():  # adapters away from their zero init, so they would show
        for name, param in actor.module.named_parameters():
            if ".lora_B." in name:
                param.normal_()
    reference = fsdp_reference(config, actor=actor)
    batch = rollout_batch(seed=1)
    assert torch.equal(reference.compute_ref_log_prob(batch.clone()).batch["ref_log_prob"],
                       logprobs_of(base, batch))


def test_merged_weights_equal_peft_merge_and_leave_the_module_as_it_was():
    _, _, actor = trained_actor()
    module = actor.module
    before = {k: v.clone() for k, v in module.state_dict().items()}
    merged = dict(lora.merged_weights(module))
    want = copy.deepcopy(module).merge_and_unload().state_dict()
    assert sorted(merged) == sorted(want)  # the base model's own names
    for name, tensor in want.items():  # the same W + s * B @ A: rounding over rank + 1 terms
        assert_close(merged[name], tensor, rounding(torch.float32, LORA_RANK + 1,
                                                    scale_of(tensor), tensor.numel()), name)
    assert all(torch.equal(module.state_dict()[k], v) for k, v in before.items())
    buckets = list(actor.export_weights(1 << 12))  # what a vllm/sglang rollout receives
    assert len(buckets) > 1 and {n for b in buckets for n, _ in b} == set(want)
    plain = tiny_model(seed=9)  # a rollout's own copy of the base model takes them
    assert copy_into(plain, buckets) > 0
    assert_logprobs_close(plain, module, rollout_batch(seed=6), "merged copy's log-probs")


def test_hf_rollout_generates_with_the_adapters():
    from siirl.engine.rollout.hf_rollout import HFRollout

    _, config, actor = trained_actor()
    rollout = HFRollout(config=config, peers={"actor": actor})
    module, _ = rollout.policy()
    assert module is actor.module and lora.is_lora(module)
    assert rollout.load_weights(iter(())) == 0  # trained in place: nothing to copy


@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing")  # peft on transformers 5
def test_adapter_only_checkpoint_round_trip(tmp_path):
    _, config, actor = trained_actor()
    folder = tmp_path / "actor"
    actor.save_checkpoint(str(folder))
    assert sorted(os.listdir(folder)) == sorted(
        [lora.ADAPTER_CONFIG, lora.ADAPTER_WEIGHTS, OPTIMIZER_FILE, EXTRA_FILE])
    saved = load_tensors(str(folder / lora.ADAPTER_WEIGHTS))
    assert len(saved) == 28 and all(".lora_A." in k or ".lora_B." in k for k in saved)
    assert json.loads((folder / lora.ADAPTER_CONFIG).read_text())["r"] == 4

    # a fresh actor (other adapter init) takes the adapters, moments and update count back
    _, fresh = lora_actor("trainer.seed=11")
    fresh.load_checkpoint(str(folder))
    trained = dict(actor.module.named_parameters())
    for name, param in fresh.module.named_parameters():
        assert torch.equal(param, trained[name]), name
    def moments(engine):
        return {n: engine.optimizer.state[p]["exp_avg"]
                for n, p in engine.module.named_parameters() if p.requires_grad}

    moments, reloaded = moments(actor), moments(fresh)
    assert moments.keys() == reloaded.keys()
    assert all(torch.equal(moments[n], reloaded[n]) for n in moments)
    assert fresh.actor.update_count == actor.actor.update_count == 1

    # the folder is a peft adapter folder: PeftModel.from_pretrained loads it
    loaded = peft.PeftModel.from_pretrained(tiny_model(), str(folder))
    assert_logprobs_close(loaded, actor.module, rollout_batch(seed=2),
                          "reloaded adapters' log-probs")


def test_checkpoint_of_another_kind_is_refused(tmp_path):
    from siirl.dag_worker.checkpoint.errors import CheckpointError

    _, _, actor = trained_actor()
    actor.save_checkpoint(str(tmp_path / "lora"))
    full = fsdp_actor(parse_config(BASE), module=tiny_model())
    full.save_checkpoint(str(tmp_path / "full"))
    with pytest.raises(CheckpointError, match="holds full model weights"):
        actor.load_checkpoint(str(tmp_path / "full"))
    with pytest.raises(CheckpointError, match="LoRA adapters only"):
        full.load_checkpoint(str(tmp_path / "lora"))
    _, other_rank = lora_actor("actor_rollout_ref.model.lora_rank=2")
    with pytest.raises(CheckpointError, match="does not match this run's LoRA"):
        other_rank.load_checkpoint(str(tmp_path / "lora"))


@pytest.mark.parametrize("merge", [False, True])
def test_hf_export_writes_the_adapter_and_on_request_the_merged_model(tmp_path, merge):
    from transformers import AutoModelForCausalLM

    _, _, actor = trained_actor(f"actor_rollout_ref.model.lora_merge_on_export={merge}")
    out = tmp_path / "huggingface"
    actor.export_hf(str(out))
    names = set(os.listdir(out))
    assert {lora.ADAPTER_CONFIG, lora.ADAPTER_WEIGHTS, "tokenizer.json"} <= names
    assert "model.safetensors" not in names
    assert ("merged" in names) == merge
    if merge:
        merged = AutoModelForCausalLM.from_pretrained(str(out / "merged"))
        assert_logprobs_close(merged, actor.module, rollout_batch(seed=4),
                              "merged export's log-probs")


def test_a_missing_peft_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft raises ImportError
    with pytest.raises(ConfigError) as info:
        lora_actor()
    assert 'pip install "siirl-engine[lora]"' in str(info.value)
    assert "actor_rollout_ref.model.lora_rank" in str(info.value)


def test_target_modules_list_and_exclude_modules():
    _, actor = lora_actor("actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
                          "actor_rollout_ref.model.exclude_modules=.*layers\\.1\\..*")
    trainable = [n for n, p in actor.module.named_parameters() if p.requires_grad]
    assert len(trainable) == 4 and all("layers.0." in n for n in trainable)
    with pytest.raises(ConfigError, match="target_modules"):
        lora_actor("actor_rollout_ref.model.target_modules=[no_such_layer]")


@pytest.mark.parametrize("overrides,refused", [
    (["actor_rollout_ref.model.lora_rank=8"], False),
    (["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.actor.strategy=megatron"], False),
    (["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.actor.strategy=megatron",
      "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"], False),
    # the megatron LoRA runs with pipeline stages and sequence parallelism; its reference is
    # the actor's own model with the adapters off
    (["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.actor.strategy=megatron",
      "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"], False),
    (["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.actor.strategy=megatron",
      "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
      "actor_rollout_ref.actor.megatron.sequence_parallel=true"], False),
    (["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.ref.strategy=megatron"], True),
    (["critic.model.lora_rank=8"], True),
])
def test_where_lora_is_refused(overrides, refused):
    if refused:
        with pytest.raises(ConfigError, match="lora_rank"):
            parse_config(overrides)
    else:
        parse_config(overrides)


def test_lora_settings_without_lora_are_a_notice(capsys):
    parse_config(["actor_rollout_ref.model.lora_alpha=32"])
    assert "lora_alpha" in capsys.readouterr().err
