"""The ``vllm`` rollout against the trainer's own model (CPU, fp32, in-process vLLM).

After each weight sync (dummy start, then after 1 and 3 training steps of the fsdp actor)
vLLM's greedy responses equal the ``hf`` rollout's for the same weights and prompts, and the
log-probs vLLM returns agree with the actor's own within 1e-3. Runs where vLLM is importable
(``bash tools/setup.sh --vllm`` builds ``.venv-vllm``); skipped elsewhere.
"""

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (tools/setup.sh --vllm)")

from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

from siirl.data_coordinator.fields import ROLLOUT_LOG_PROBS  # noqa: E402
from siirl.data_coordinator.protocol import make_batch  # noqa: E402
from siirl.engine.fsdp.engines import fsdp_actor  # noqa: E402
from siirl.engine.models.loader import tiny_arith_dir  # noqa: E402
from siirl.engine.rollout.hf_rollout import HFRollout  # noqa: E402
from siirl.engine.rollout.vllm_rollout import VLLMRollout  # noqa: E402
from siirl.params.parser import parse_config  # noqa: E402

pytestmark = pytest.mark.vllm
RESPONSE = 6


def save_random_model(path) -> None:
    """A random Llama with head_dim 32 (vLLM's CPU minimum) and the tiny-arith tokenizer."""
    source = LlamaConfig.from_pretrained(tiny_arith_dir())
    config = LlamaConfig(**{**source.to_dict(), "num_attention_heads": 2,
                            "num_key_value_heads": 2, "head_dim": 32})
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_arith_dir()).save_pretrained(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("hd32")
    save_random_model(path)
    return path


def run_config(model_dir, *overrides):
    return parse_config([
        f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cpu",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.max_num_seqs=64",
        f"data.max_response_length={RESPONSE}", "data.max_prompt_length=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.optim.lr=0.01", "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.entropy_coeff=0", *overrides])


def prompts(tokenizer, texts):
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return make_batch({"input_ids": ids, "attention_mask": mask,
                       "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
                       "sample_id": torch.arange(len(rows))})


TEXTS = ["13+5=", "2+2=", "20-7=", "9-9=", "4+11="]


@pytest.fixture(scope="module")
def engines(model_dir):
    config = run_config(model_dir)
    actor = fsdp_actor(config)
    rollout = VLLMRollout(config=config, peers={"actor": actor})
    return config, actor, rollout


def sync(actor, rollout):
    return rollout.load_weights(actor.export_weights(1 << 20))  # several buckets


def assert_matches_hf(config, actor, rollout):
    batch = prompts(actor.tokenizer, TEXTS)
    got = rollout.generate(batch.clone(), validate=True).batch  # greedy (val_kwargs)
    want = HFRollout(config=config, peers={"actor": actor}).generate(
        batch.clone(), validate=True).batch
    assert torch.equal(got["responses"], want["responses"])
    assert torch.equal(got["response_mask"], want["response_mask"])
    own = actor.compute_log_prob(got.clone()).batch["old_log_probs"]
    mask = got["response_mask"]
    assert (got[ROLLOUT_LOG_PROBS] * (1 - mask)).abs().max() == 0  # 0 on padding
    assert (got[ROLLOUT_LOG_PROBS] - own * mask).abs().max() < 1e-3
    return got


def train_steps(config, actor, rollout, count):
    for _ in range(count):
        batch = rollout.generate(prompts(actor.tokenizer, TEXTS[:2])).batch  # sampled, n=2
        batch = actor.compute_log_prob(batch).batch
        sign = torch.tensor([1.0, -1.0, -1.0, 1.0])[:, None]
        batch.set("advantages", batch["response_mask"] * sign)
        actor.update_policy(batch)
        sync(actor, rollout)


def test_dummy_start_refuses_to_generate_until_synced(engines):
    config, actor, rollout = engines
    if rollout.needs_weights:
        with pytest.raises(RuntimeError, match="weight sync must run"):
            rollout.generate(prompts(actor.tokenizer, TEXTS[:1]))
    moved = sync(actor, rollout)
    assert moved == sum(t.numel() * t.element_size() for t in actor.module.state_dict().values())
    assert not rollout.needs_weights
    assert_matches_hf(config, actor, rollout)


def test_greedy_and_log_probs_match_after_one_and_three_steps(engines):
    config, actor, rollout = engines
    if rollout.needs_weights:
        sync(actor, rollout)
    before = rollout.generate(prompts(actor.tokenizer, TEXTS), validate=True).batch
    train_steps(config, actor, rollout, 1)
    assert_matches_hf(config, actor, rollout)
    train_steps(config, actor, rollout, 2)
    after = rollout.generate(prompts(actor.tokenizer, TEXTS), validate=True).batch
    assert_matches_hf(config, actor, rollout)
    # lr 0.01 for 3 steps moves a random model's greedy log-probs: the sync is not a no-op
    assert not torch.allclose(before[ROLLOUT_LOG_PROBS], after[ROLLOUT_LOG_PROBS])


def test_samples_are_keyed_per_row(engines):
    """A prompt's samples do not depend on the other rows of the batch."""
    _, actor, rollout = engines
    if rollout.needs_weights:
        sync(actor, rollout)
    rollout._calls = (-1, 0)  # both calls are then the first of their step
    both = rollout.generate(prompts(actor.tokenizer, TEXTS[:2])).batch
    rollout._calls = (-1, 0)
    alone = rollout.generate(prompts(actor.tokenizer, TEXTS[:1])).batch
    width = alone["responses"].shape[1]
    assert torch.equal(both["responses"][:2, :width], alone["responses"])
    assert both.batch_size[0] == 4 and both["uid"] is not None


def test_one_seed_per_call_repeats_and_leaves_the_rng_alone(engines):
    """seed_per_prompt=false: unseeded requests, the call's RNG seeded from its keys."""
    _, actor, rollout = engines
    if rollout.needs_weights:
        sync(actor, rollout)
    settings = rollout.cfg.actor_rollout_ref.rollout
    settings.seed_per_prompt = False
    try:
        runs, states = [], []
        for _ in range(2):
            rollout._calls = (-1, 0)  # the same step and call: the same keys
            state = torch.get_rng_state()
            runs.append(rollout.generate(prompts(actor.tokenizer, TEXTS)).batch["responses"])
            states.append(torch.equal(state, torch.get_rng_state()))
        rollout._calls = (0, 5)  # another call of the step: other keys, other noise
        other = rollout.generate(prompts(actor.tokenizer, TEXTS)).batch["responses"]
    finally:
        settings.seed_per_prompt = True
    assert torch.equal(runs[0], runs[1]) and all(states)
    assert not torch.equal(runs[0], other)


def test_a_lora_actor_sends_merged_weights_and_vllm_plays_them(engines, model_dir):
    """LoRA (peft) on the actor: vLLM gets the base weights with the adapters merged in
    (under the base names, the same bytes as a full model) and plays what the hf rollout
    plays with the adapters on. Runs last: it gives the engine back the plain actor's."""
    config, actor, rollout = engines
    lora_config = run_config(model_dir, "actor_rollout_ref.model.lora_rank=8",
                             "actor_rollout_ref.model.lora_alpha=16",
                             "actor_rollout_ref.model.target_modules=all-linear")
    lora_actor = fsdp_actor(lora_config)
    try:
        moved = sync(lora_actor, rollout)
        assert moved == sum(t.numel() * t.element_size()
                            for t in actor.module.state_dict().values())
        train_steps(lora_config, lora_actor, rollout, 2)
        adapters = [p for n, p in lora_actor.module.named_parameters() if "lora_B" in n]
        assert adapters and any(p.abs().max() > 0 for p in adapters)  # the adapters moved
        assert_matches_hf(lora_config, lora_actor, rollout)
    finally:
        sync(actor, rollout)
