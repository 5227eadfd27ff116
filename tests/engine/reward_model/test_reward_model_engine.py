"""The sequence-classification reward model (role reward_model): where its scores go, that
micro-batches and token budgets change nothing, and re-tokenisation for another tokenizer."""

from types import SimpleNamespace

import pytest
import torch

from siirl.engine.reward_model.combine import RM_SCORES
from siirl.engine.reward_model.factory import fsdp_reward_model
from siirl.engine.reward_model.loading import BUILTIN_TINY_REWARD, load_tokenizer
from siirl.errors import ConfigError
from siirl_numerics import assert_close, rounding, scale_of, transformer_terms
from siirl_rm_batches import ShiftedTokenizer, rollout_batch

torch.set_num_threads(1)
EOS = 2


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(BUILTIN_TINY_REWARD)


def engine(tok, actor_tokenizer=None, **rm):
    config = {"reward_model": {"enable": True, "model": {"path": BUILTIN_TINY_REWARD}, **rm}}
    return fsdp_reward_model(config, peers={"actor": SimpleNamespace(
        tokenizer=actor_tokenizer or tok)})


def score_tolerance(rm, want, batch):
    """The same rows scored in another batching (padding, micro-batches, token budgets):
    float32 rounding of the reward model's reductions over the batch's width."""
    width = batch["input_ids"].shape[1]
    return rounding(torch.float32, transformer_terms(rm.backend.module.config, width),
                    max(scale_of(want), 1.0), want.numel())


def ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def direct(module, seq):
    """The model's own score of one unpadded sequence (its pooled output)."""
    with torch.no_grad():
        return module(input_ids=torch.tensor([seq])).logits[0, 0].item()


CASES = [("13+5=", "18", True), ("2+2=", "5", True), ("20-7=", "13", False),
         ("9+9=", "1a", True)]


def case_batch(tok, eos=True):
    prompts = [ids(tok, p) for p, _, _ in CASES]
    responses = [ids(tok, r) + ([EOS] if e and eos else []) for _, r, e in CASES]
    return rollout_batch(prompts, responses, tok.pad_token_id), prompts, responses


def test_scores_sit_on_the_last_response_token_and_equal_the_models_own(tok):
    rm = engine(tok)
    assert not rm.retokenize  # the tiny reward model shares the tiny policy's tokenizer
    batch, prompts, responses = case_batch(tok)
    out = rm.compute_rm_score(batch)
    scores = out.batch[RM_SCORES]
    assert scores.shape == (4, 6) and scores.dtype == torch.float32
    for row, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        assert torch.count_nonzero(scores[row, len(r):]) == 0
        assert torch.count_nonzero(scores[row, :len(r) - 1]) == 0
        want = torch.tensor(direct(rm.backend.module, p + r))
        assert_close(scores[row, len(r) - 1], want, score_tolerance(rm, want, batch),
                     f"row {row}")
    row_scores = scores.sum(-1)
    assert out.metrics["reward/rm/mean"] == pytest.approx(row_scores.mean().item())
    assert out.metrics["reward/rm/std"] == pytest.approx(row_scores.std(unbiased=False).item())
    assert not any(p.requires_grad for p in rm.backend.module.parameters())


def test_the_tiny_reward_model_prefers_right_answers(tok):
    rm = engine(tok)
    right = rollout_batch([ids(tok, "13+5=")] * 2, [ids(tok, "18") + [EOS],
                                                    ids(tok, "abc") + [EOS]],
                          tok.pad_token_id)
    scores = rm.compute_rm_score(right).batch[RM_SCORES].sum(-1)
    assert scores[0] > scores[1]


def test_micro_batches_and_token_budgets_give_the_scores_of_one_batch(tok):
    whole = engine(tok).compute_rm_score(case_batch(tok)[0]).batch[RM_SCORES]
    micro = engine(tok, micro_batch_size_per_gpu=1)
    assert micro.micro_rows == 1
    assert_close(micro.compute_rm_score(case_batch(tok)[0]).batch[RM_SCORES], whole,
                 score_tolerance(micro, whole, case_batch(tok)[0]), "micro-batched scores")
    budget = engine(tok, use_dynamic_bsz=True, forward_max_token_len_per_gpu=12)
    assert_close(budget.compute_rm_score(case_batch(tok)[0]).batch[RM_SCORES], whole,
                 score_tolerance(budget, whole, case_batch(tok)[0]), "token-budget scores")
    with pytest.raises(ConfigError, match="forward_max_token_len_per_gpu=3"):
        engine(tok, use_dynamic_bsz=True,
               forward_max_token_len_per_gpu=3).compute_rm_score(case_batch(tok)[0])


def test_another_policy_tokenizer_is_decoded_and_re_tokenised(tok):
    shifted = ShiftedTokenizer()
    rm = engine(tok, actor_tokenizer=shifted)
    assert rm.retokenize
    # the same texts in the policy's ids; decoding drops EOS, so compare rows without it
    theirs = rollout_batch([shifted.encode(p) for p, _, _ in CASES],
                           [shifted.encode(r) for _, r, _ in CASES], shifted.pad_token_id)
    ours = case_batch(tok, eos=False)[0]
    expected = engine(tok).compute_rm_score(ours).batch[RM_SCORES]
    got = rm.compute_rm_score(theirs).batch[RM_SCORES]
    assert_close(got, expected, score_tolerance(rm, expected, theirs), "re-tokenised scores")
    # with chat messages in the batch, the prompt is the messages (no chat template here)
    messages = [[{"role": "user", "content": p}] for p, _, _ in CASES]
    theirs = rollout_batch([[200]] * 4, [shifted.encode(r) for _, r, _ in CASES],
                           shifted.pad_token_id, messages=messages)
    assert_close(rm.compute_rm_score(theirs).batch[RM_SCORES], expected,
                 score_tolerance(rm, expected, theirs), "scores of chat messages")


def test_max_length_keeps_the_end_of_each_row(tok):
    rm = engine(tok, max_length=3)
    batch, prompts, responses = case_batch(tok)
    scores = rm.compute_rm_score(batch).batch[RM_SCORES]
    for row, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        assert scores[row, len(r) - 1].item() == pytest.approx(
            direct(rm.backend.module, (p + r)[-3:]), abs=1e-5)


def test_a_missing_model_and_an_unknown_style_name_their_key(tok):
    with pytest.raises(ConfigError, match="reward_model.model.path: no model at"):
        fsdp_reward_model({"reward_model": {"enable": True, "model": {"path": "/nowhere"}}})
    with pytest.raises(ConfigError, match="reward_model.style='judge'"):
        fsdp_reward_model({"reward_model": {"enable": True, "style": "judge"}})
