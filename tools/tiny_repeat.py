"""The repeat task for the tiny-model builder (``make_tiny_model.py --task repeat``).

The problems are the rows the job writes for ``data.builtin_task=repeat`` (siirl-data's
``siirl.data_coordinator.tasks.repeat`` with the job's default ``data.seed``): the model is
pretrained on the job's training rows, long tail included, and measured on its validation
prompts, which it never sees. Answers are up to 40 letters, so generation uses the KV cache
of ``transformers``' ``generate``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from tiny_build import EOS_ID, PAD_ID, remake

from siirl.data_coordinator.settings import DataArguments
from siirl.data_coordinator.tasks import repeat as data_task

MAX_NEW = data_task.MAX_UNIT * data_task.MAX_K + 4  # the longest answer, EOS and slack
MAX_POSITIONS = 96  # prompt (<= 8 tokens) + MAX_NEW, with room to spare
N_TRAIN_MEASURED = 400  # training rows the "all" accuracy is measured on (for speed)
ROOT = Path(__file__).resolve().parents[1]
ASSET_DIR = ROOT / "packages/siirl-engine/src/siirl/engine/assets/tiny_repeat"


def split_problems(seed: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The job's (train, val) rows as (prompt, answer); ``seed`` is the model's and does not
    change them (the data seed is the job's default ``data.seed``)."""
    train, val = data_task.make_splits(seed=DataArguments().seed)
    pairs = [[(r["prompt"][0]["content"], r["reward_model"]["ground_truth"]) for r in rows]
             for rows in (train, val)]
    return pairs[0], pairs[1]


def encode(tok, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    enc = tok(prompts, padding=True, return_tensors="pt", add_special_tokens=False)
    return enc["input_ids"], enc["attention_mask"]


@torch.no_grad()
def generate(model, tok, prompts: list[str], sample: bool = False, batch: int = 512
             ) -> list[str]:
    """Greedy or plain sampling (temperature 1, no top-k/top-p) up to EOS; decoded texts."""
    model.eval()
    texts = []
    for start in range(0, len(prompts), batch):
        ids, mask = encode(tok, prompts[start:start + batch])
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW,
                             do_sample=sample, temperature=1.0 if sample else None,
                             top_k=0 if sample else None, top_p=1.0 if sample else None,
                             pad_token_id=PAD_ID, eos_token_id=EOS_ID)
        texts += tok.batch_decode(out[:, ids.shape[1]:].tolist(), skip_special_tokens=True)
    return texts


def response_lengths(model, tok, prompts: list[str]) -> list[int]:
    """Greedy response lengths in tokens, EOS included (what the rollout generates)."""
    model.eval()
    lengths = []
    with torch.no_grad():
        for start in range(0, len(prompts), 512):
            ids, mask = encode(tok, prompts[start:start + 512])
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=MAX_NEW,
                                 do_sample=False, pad_token_id=PAD_ID, eos_token_id=EOS_ID)
            resp = out[:, ids.shape[1]:]
            ended = resp == EOS_ID
            first = torch.where(ended.any(1), ended.float().argmax(1) + 1,
                                torch.full((resp.shape[0],), resp.shape[1]))
            lengths += first.tolist()
    return lengths


def greedy_accuracy(model, tok, problems) -> float:
    texts = generate(model, tok, [p for p, _ in problems])
    return sum(t.strip() == a for t, (_, a) in zip(texts, problems, strict=True)) / len(problems)


def sampled_stats(model, tok, problems, k: int = 8, seed: int = 0) -> tuple[float, float]:
    """(mean sampled accuracy, pass@k) at temperature 1."""
    torch.manual_seed(seed)
    texts = generate(model, tok, [p for p, _ in problems for _ in range(k)], sample=True)
    hits = torch.tensor([t.strip() == a for t, (_, a) in
                         zip(texts, [q for q in problems for _ in range(k)], strict=True)],
                        dtype=torch.float32).view(len(problems), k)
    return hits.mean().item(), (hits.max(1).values > 0).float().mean().item()


def card_text(info: dict) -> str:
    lengths = info["lengths"]
    spread = f"{lengths['mean']:.1f} / {lengths['p50']} / {lengths['p90']} / {lengths['max']}"
    return f"""# {info["name"]}

A tiny character-level Llama ({info["params"]:,} parameters, float32) for siiRL's built-in
repeat task, whose response lengths have a long tail (for the asynchronous preset).
`siirl-train actor_rollout_ref.model.path=builtin:tiny-repeat data.builtin_task=repeat
data.max_response_length=48` runs GRPO on it. It is not useful for anything else.

* Prompt: `"ab*3="` (a unit of 1..4 letters from `abcd`, repeated k times, k in 1..10 with
  P(k) ~ k^-{data_task.TAIL:g}), used verbatim: no chat template. Response: `"ababab"`, then EOS.
* Tokenizer: tiny_arith's (one token per character, `<pad>`=0, `<s>`=1, `</s>`=2,
  `<unk>`=3; no BOS added; left padding).
* Model: `LlamaForCausalLM`, hidden {info["hidden"]}, {info["layers"]} layers,
  {info["heads"]} heads, intermediate {4 * info["hidden"]}, tied embeddings, vocab
  {info["vocab"]}, max positions {MAX_POSITIONS}.

## How it was made

`tools/make_tiny_model.py --task repeat`, seed {info["seed"]}: supervised pretraining for
{info["steps"]} steps (AdamW, lr {info["lr"]} with warmup and cosine decay, weight decay
{info["wd"]}, batch {info["batch_size"]}, loss on the answer tokens only) on the
{info["n_train"]} training rows the job writes (`data.seed` {DataArguments().seed}), stopped
early at the first check where greedy accuracy (on the {info["n_val"]} validation prompts,
never trained on, and on {N_TRAIN_MEASURED} training rows) was in the window
[{info["lo"]}, {info["hi"]}] and sampled pass@8 on the validation prompts was at least
{info["min_pass"]}. The pretraining answers are all correct.

| measure | value |
| --- | --- |
| greedy accuracy, validation ({info["n_val"]} prompts) | {info["greedy_val"]:.3f} |
| greedy accuracy, {N_TRAIN_MEASURED} training rows | {info["greedy_all"]:.3f} |
| sampled accuracy, validation (temperature 1) | {info["sampled_val"]:.3f} |
| sampled pass@8, validation (temperature 1) | {info["pass8_val"]:.3f} |
| greedy response length on the training rows, tokens with EOS: mean / p50 / p90 / max | {spread} |

{remake(info["command"], info["took"])}"""


TASK = SimpleNamespace(
    name="repeat", asset_dir=ASSET_DIR, max_positions=MAX_POSITIONS, split=split_problems,
    greedy=greedy_accuracy, sampled=sampled_stats, card=card_text,
    measured=lambda train, val: train[:N_TRAIN_MEASURED],
    corpus=lambda train, args: [(p, a, 1.0) for p, a in train])
