"""Shared by the LoRA tests (test_lora.py: one process; test_lora_fsdp2_gloo.py: FSDP2 over
two gloo ranks): a tiny Llama, its word-level tokenizer, a rollout batch, and the fsdp actor
with LoRA adapters."""

import torch

from siirl.data_coordinator.protocol import make_batch
from siirl.engine.fsdp.engines import fsdp_actor
from siirl.params.parser import parse_config

VOCAB, PROMPT, RESPONSE = 32, 4, 5
LORA_RANK = 4
LORA = [f"actor_rollout_ref.model.lora_rank={LORA_RANK}", "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.model.target_modules=all-linear"]
BASE = ["actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=0.05", "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.n=1", "actor_rollout_ref.actor.use_kl_loss=true",
        "trainer.seed=3"]


def tiny_model(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2)
    return LlamaForCausalLM(config).float()


def tiny_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")), pad_token="t0")


def rollout_batch(rows: int = 4, seed: int = 0):
    """Left-padded prompts + right-padded responses, advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, VOCAB, (rows, PROMPT), generator=g)
    responses = torch.randint(3, VOCAB, (rows, RESPONSE), generator=g)
    prompt_mask = torch.ones(rows, PROMPT, dtype=torch.long)
    response_mask = torch.ones(rows, RESPONSE)
    for i in range(0, rows, 2):
        prompts[i, 0], prompt_mask[i, 0] = 0, 0
        responses[i, -1], response_mask[i, -1] = 0, 0
    attention_mask = torch.cat([prompt_mask, response_mask.long()], dim=1)
    return make_batch({
        "prompts": prompts, "responses": responses, "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp_min(0),
        "advantages": response_mask * torch.linspace(-1.0, 2.0, rows)[:, None],
    })


def trainable(module, grads: bool = False):
    """The adapters (or their gradients), whole (gathered where FSDP2 shards them)."""
    out = {}
    for name, param in module.named_parameters():
        if param.requires_grad:
            tensor = param.grad if grads else param.detach()
            out[name] = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return out


def lora_actor(*overrides, module=None, worker=None):
    config = parse_config(BASE + LORA + list(overrides))
    module = module if module is not None else tiny_model()
    return config, fsdp_actor(config, worker, module=module, tokenizer=tiny_tokenizer())
