"""What the tiny-model builders share (``make_tiny_model.py``, ``make_tiny_agent.py``,
``make_tiny_reward_model.py``, ``make_tiny_vla.py``): the tokenizer's special tokens and
construction, the seeded one-thread set-up, the supervised training loop's pieces (AdamW,
warm-up + cosine schedule, shuffled passes over the data, one optimiser step), and writing
the artefacts (tokenizer files loadable by transformers 4 and 5, the model card, readable
file modes).

Each builder keeps what is its own: its task, data, losses, checks and the card's text.
The pieces here consume random numbers exactly as the builders did inline, so a re-run
still reproduces the shipped weights.
"""

from __future__ import annotations

import json
import math
import random
import shlex
import string
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
# one token per printable ASCII character (tab and the rarer blanks aside), so any ASCII
# text round-trips through a word-level tokenizer
PRINTABLE = sorted(set(string.printable) - set("\t\r\x0b\x0c"))


# --------------------------------------------------------------------------- tokenizer
def fast_tokenizer(core: Tokenizer, max_length: int,
                   additional_special_tokens: Optional[list] = None) -> PreTrainedTokenizerFast:
    """``core`` as a transformers tokenizer: SPECIALS at ids 0..3, no BOS added by the
    builders' prompts, left padding."""
    extra = {} if additional_special_tokens is None else \
        {"additional_special_tokens": additional_special_tokens}
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        unk_token="<unk>", **extra, padding_side="left", model_max_length=max_length,
        clean_up_tokenization_spaces=False)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (
        PAD_ID, BOS_ID, EOS_ID, UNK_ID)
    return tok


def word_tokenizer(vocab_tokens: Sequence[str], words: Sequence[str], max_length: int,
                   specials: Sequence[str] = tuple(SPECIALS), added: Sequence[str] = (),
                   additional_special_tokens: Optional[list] = None) -> PreTrainedTokenizerFast:
    """Word level: each of ``words`` is one token (matched in the order given, so list a
    word before its prefixes), anything else one token per character. ``vocab_tokens`` are
    the ids in order; ``specials`` are never split, ``added`` are whole entries in text too."""
    vocab = {tok: i for i, tok in enumerate(vocab_tokens)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    pattern = "|".join(w.replace("/", "\\/") for w in words)
    core.pre_tokenizer = pre_tokenizers.Split(Regex(f"{pattern}|[\\s\\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(specials))
    if added:
        core.add_tokens(list(added))
    return fast_tokenizer(core, max_length, additional_special_tokens)


# ------------------------------------------------------------------------ set-up, log
def seeded(seed: int, python_random: bool = False) -> None:
    """One CPU thread, seeded, deterministic algorithms: a re-run gives the same weights
    (on the same torch build)."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    if python_random:
        random.seed(seed)
    torch.use_deterministic_algorithms(True)


def timed_log() -> Callable[[str], None]:
    """``log(msg)`` printing the seconds since this call."""
    t0 = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t0:6.1f}s] {msg}", flush=True)

    log.t0 = t0
    return log


def command_line(script: str, argv: Optional[list]) -> str:
    """The command that built an artefact, for its card: ``script`` and the arguments."""
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join([f"python tools/{script}", *map(shlex.quote, args)])


# --------------------------------------------------------------------- training loop
def adamw(params: Iterable, lr: float, wd: float) -> torch.optim.AdamW:
    return torch.optim.AdamW(params, lr=lr, weight_decay=wd, betas=(0.9, 0.98))


def warmup_cosine(lr: float, steps: int, warmup: int, floor: float) -> Callable[[int], float]:
    """Learning rate at (0-based) ``step``: linear warm-up over ``warmup`` steps, then a
    cosine decay to ``floor * lr`` at ``steps``."""
    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        t = min(1.0, (step - warmup) / max(1, steps - warmup))
        return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))

    return lr_at


def python_permutation(rng: random.Random) -> Callable[[int], list]:
    def permutation(n: int) -> list:
        more = list(range(n))
        rng.shuffle(more)
        return more

    return permutation


def torch_permutation(gen: torch.Generator) -> Callable[[int], list]:
    return lambda n: torch.randperm(n, generator=gen).tolist()


class Shuffled:
    """Batches of indices into ``n`` rows, in shuffled passes; the next pass is appended
    when fewer than a batch remain, so a batch can span two passes."""

    def __init__(self, n: int, batch_size: int, permutation: Callable[[int], list]):
        self.n, self.batch_size, self.permutation = n, batch_size, permutation
        self.order: list = []

    def next(self) -> list:
        if len(self.order) < self.batch_size:
            self.order += self.permutation(self.n)
        batch, self.order = self.order[:self.batch_size], self.order[self.batch_size:]
        return batch


def optimiser_step(opt: torch.optim.Optimizer, loss: torch.Tensor, lr: float,
                   clip: Optional[Iterable] = None) -> None:
    """Set ``lr``, back-propagate ``loss``, clip the gradient norm of ``clip`` to 1, step."""
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad()
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(clip, 1.0)
    opt.step()


# ---------------------------------------------------------------------------- batches
def left_padded(seqs: Sequence[Sequence[int]]) -> tuple:
    """``(ids, attention_mask, position_ids)``, padded on the left as the rollout feeds
    prompts; positions count real tokens, so padding does not move them."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        ids[row, width - len(seq):] = torch.tensor(seq)
        mask[row, width - len(seq):] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def right_padded(seqs: Sequence[Sequence[int]], labels: Sequence[Sequence[int]]) -> tuple:
    """``(ids, attention_mask, labels)`` padded on the right for supervised training;
    labels are -100 where no loss is taken (and in the padding)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), PAD_ID, dtype=torch.long)
    lab = torch.full((len(seqs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, (seq, target) in enumerate(zip(seqs, labels, strict=True)):
        ids[row, :len(seq)] = torch.tensor(seq)
        lab[row, :len(target)] = torch.tensor(target)
        mask[row, :len(seq)] = 1
    return ids, mask, lab


# ------------------------------------------------------------------------- artefacts
def save_tokenizer(tok: PreTrainedTokenizerFast, out: Path) -> None:
    """The tokenizer files, with the portable class name: transformers 5 writes its own,
    the generic one loads in 4.x and 5.x alike."""
    tok.save_pretrained(out)
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.pop("backend", None)
    path.write_text(json.dumps(config, indent=2) + "\n")


def remake(command: str, took: str) -> str:
    """The model card's closing lines: how to build it again."""
    return (f"Remake it (deterministic: seeded, one CPU thread; {took}):\n\n"
            f"    {command}\n")


def finish(out: Path, card: str, log: Callable[[str], None], note: str = "") -> None:
    """Write the model card, make every file readable (safetensors writes 0600; the wheel
    must ship readable files) and log the folder's size."""
    (out / "README.md").write_text(card)
    for f in out.iterdir():
        f.chmod(0o644)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    log(f"saved to {out} ({size / 1024:.0f} KiB){note}")
