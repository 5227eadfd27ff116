"""Build siiRL's built-in tiny vision-language-action model (``siirl/engine/assets/tiny_vla``,
``builtin:tiny-vla``): a few hundred thousand parameters that play the ``reach`` tasks
(Reach2D): the reach tasks well, the push tasks rarely.

    python tools/make_tiny_vla.py          # build, warm up, save (several minutes on a CPU)

It is made for the EMBODIED presets: behaviour cloning runs its whole schedule (no early
stop, no softening after it), and the model card states what it then scores, greedy and
sampled. It reaches almost always; pushing a block past a line (the expert goes round the
block and shoves it) it imitates well enough to succeed now and then when sampled (RL on
the push tasks has not improved that yet: docs/embodied.md).

* Steps are the real ones: per chunk step the prompt is the instruction's ids, 16 image
  placeholders and one proprio placeholder (``vla_inputs.vla_prompt_ids``), left-padded, and
  the response the chunk's ``k * 2`` action tokens (``ActionTokenizer``, 256 bins).
* Behaviour cloning with DART-style noise: the scripted expert acts with Gaussian noise
  (standard deviation per episode, in turn from ``--noises``), so the episodes wander off
  its path; every visited state is labelled with the expert's noise-free chunk from that
  state. The loss is on the action tokens only, against targets spread over a few
  neighbouring bins (``--label-sigma``, one bin: narrow enough for greedy decoding to
  follow the expert; three bins left every bin distribution wide).
* Two stages. First ``--aux-steps`` steps on auxiliary read-outs alone (linear probes,
  not saved): every block's and the gripper's position from the image tokens, the target
  block's position and offset from the backbone's output at the proprio token. Without
  them the policy learns to ignore the image (instruction and proprio alone lower the
  loss), and imitation stalls at reach-by-luck. Then imitation, read-outs kept on.
* Tokenizer (``tokenizers`` word level): ``<pad>``=0, ``<s>``=1, ``</s>``=2, ``<unk>``=3,
  ``<image>``, ``<proprio>``, the instruction words, every printable ASCII character (any
  instruction round-trips), then the 256 action tokens as the last ids, ``<a{i}>`` = bin
  ``i`` = id ``vocab - 1 - i``.

Every ``--eval-every`` imitation steps, and at the end, it plays held-out seeds greedily and
sampled at temperature 1 (logged only: nothing is chosen by them). Everything is seeded and
runs on one CPU thread, so a re-run reproduces the same weights (on the same torch build).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tiny_build import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    PRINTABLE,
    SPECIALS,
    Shuffled,
    adamw,
    command_line,
    finish,
    left_padded,
    optimiser_step,
    save_tokenizer,
    seeded,
    timed_log,
    torch_permutation,
    warmup_cosine,
    word_tokenizer,
)
from tiny_vla_card import (
    BINS,
    CHUNK,
    ENV,
    GRID,
    TASK_IDS,
    TEMPERATURE,
    WORDS,
    card_text,
    envs_record,
)

from siirl.engine.models.tiny_vla import TinyVLAConfig, TinyVLAForActionPrediction
from siirl.environment.embodied.tasks.reach2d import Reach2D, expert_chunk
from siirl.environment.embodied.vla_inputs import (
    IMAGE_TOKEN,
    PROPRIO_TOKEN,
    action_token_name,
    action_tokenizer_for,
    vla_prompt_ids,
)

ROOT = Path(__file__).resolve().parents[1]
ASSET_DIR = ROOT / "packages/siirl-engine/src/siirl/engine/assets/tiny_vla"
PLACEHOLDERS = [IMAGE_TOKEN, PROPRIO_TOKEN]


# --------------------------------------------------------------------------- tokenizer
def build_tokenizer():
    """Known words are one token, everything else one token per character; the action
    tokens last, in ``ActionTokenizer``'s order (bin 0 is the last id), whole entries in
    text too, so decode -> encode round-trips."""
    actions = [action_token_name(i) for i in reversed(range(BINS))]
    vocab = SPECIALS + PLACEHOLDERS + WORDS + PRINTABLE + actions
    # longest first, so "top" is not read as "to" + "p"
    tok = word_tokenizer(vocab, sorted(WORDS, key=len, reverse=True), 128,
                         specials=SPECIALS + PLACEHOLDERS, added=actions,
                         additional_special_tokens=PLACEHOLDERS)
    assert len(tok) == len(vocab) and tok.convert_tokens_to_ids(action_token_name(0)) == \
        len(tok) - 1
    text = "push the blue block to the top"
    assert tok.convert_ids_to_tokens(tok.encode(text)) == [
        "push", " ", "the", " ", "blue", " ", "block", " ", "to", " ", "the", " ", "top"]
    assert tok.decode(tok.encode(text)) == text
    return tok


def build_model(tok, hidden: int, layers: int, heads: int, head_dim: int,
                intermediate: int) -> TinyVLAForActionPrediction:
    image_id, proprio_id = tok.convert_tokens_to_ids(PLACEHOLDERS)
    cfg = TinyVLAConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, head_dim=head_dim,
        max_position_embeddings=128, image_grid=GRID, proprio_dim=4, action_bins=BINS,
        image_token_id=image_id, proprio_token_id=proprio_id, pad_token_id=PAD_ID,
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, tie_word_embeddings=True)
    return TinyVLAForActionPrediction(cfg)


def new_env() -> Reach2D:
    return Reach2D(**ENV["env_config"])


# ---------------------------------------------------------------------- scripted data
def scripted_data(acts, episodes: int, noises: list, seed: int) -> dict:
    """States visited by the noisy expert, each labelled with the clean expert chunk:
    ``task`` [N], ``image`` uint8 [N, H, W, 3], ``proprio`` [N, 4], ``labels`` [N, 2k],
    and ``where`` [N, 14]: the blocks', the gripper's and the target block's positions and
    the target's offset from the gripper (the auxiliary losses' targets, in [-1, 1])."""
    rng = np.random.default_rng(seed)
    env = new_env()
    tasks, images, proprios, labels, where = [], [], [], [], []
    for i in range(episodes):
        task = i % len(TASK_IDS)
        noise = noises[(i // len(TASK_IDS)) % len(noises)]
        obs = env.reset(TASK_IDS[task], 1_000_000 + seed * 100_000 + i)
        done = False
        while not done:
            tasks.append(task)
            images.append(obs["image"])
            target, gripper = env.state.blocks[env.task.target], env.state.gripper
            where.append(np.concatenate([env.state.blocks.reshape(-1), gripper, target,
                                         (target - gripper + 1) / 2]))
            proprios.append(obs["proprio"])
            labels.append(acts.encode(expert_chunk(env, CHUNK).reshape(-1)))
            obs, _, done, _ = env.step(expert_chunk(env, CHUNK, noise, rng))
    return {"task": torch.tensor(tasks), "image": torch.from_numpy(np.stack(images)),
            "proprio": torch.from_numpy(np.stack(proprios)),
            "labels": torch.from_numpy(np.stack(labels)),
            "where": torch.tensor(np.stack(where), dtype=torch.float32) * 2 - 1}


def prompt_batch(prompts: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded ``(ids, attention_mask, position_ids)``: positions count real tokens,
    so padding does not move them (as in the rollout)."""
    return left_padded(prompts)


def bc_loss(model, prompts: dict, batch: dict, sigma: float) -> torch.Tensor:
    """Cross-entropy on the action tokens after each prompt (teacher forcing), against
    targets spread over the neighbouring bins (a Gaussian of ``sigma`` bins): a bin next to
    the expert's costs less than one far off, which plain cross-entropy ignores."""
    labels = batch["labels"]
    ids, mask, pos = prompt_batch([prompts[TASK_IDS[t]] for t in batch["task"].tolist()])
    ids = torch.cat([ids, labels], dim=1)
    mask = torch.cat([mask, torch.ones_like(labels)], dim=1)
    pos = torch.cat([pos, pos[:, -1:] + 1 + torch.arange(labels.shape[1])], dim=1)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                pixel_values=batch["image"], proprio=batch["proprio"],
                logits_to_keep=labels.shape[1] + 1)
    first = model.config.vocab_size - BINS
    logp = out.logits[:, :-1, first:].float().log_softmax(-1)
    offset = torch.arange(BINS) - (labels - first)[..., None]
    target = torch.softmax(-0.5 * (offset / sigma) ** 2, dim=-1) if sigma > 0 \
        else F.one_hot(labels - first, BINS).float()
    return -(target * logp).sum(-1).mean()


# -------------------------------------------------------------------------- evaluation
@torch.no_grad()
def act(model, acts, prompts: list, images, proprios, temperature: float,
        generator: torch.Generator | None) -> np.ndarray:
    """One chunk per prompt: a prefill with the image and proprio, then one cached step
    per action token (greedy at temperature 0). ``[B, k, 2]``."""
    ids, mask, pos = prompt_batch(prompts)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                pixel_values=torch.from_numpy(np.stack(images)),
                proprio=torch.from_numpy(np.stack(proprios)), use_cache=True,
                logits_to_keep=1)
    tokens = []
    for step in range(CHUNK * 2):
        tok = acts.sample(out.logits[:, -1], temperature, generator)
        tokens.append(tok)
        if step == CHUNK * 2 - 1:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        pos = pos[:, -1:] + 1
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=pos,
                    past_key_values=out.past_key_values, use_cache=True, logits_to_keep=1)
    chunks = acts.decode(torch.stack(tokens, 1).numpy())
    return chunks.reshape(len(prompts), CHUNK, 2)


def play(model, acts, prompts: dict, seeds, temperature: float, seed: int = 0) -> dict:
    """Success per task over ``seeds`` (every task, all episodes side by side)."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    runs = [(task, s) for task in TASK_IDS for s in seeds]
    envs = [new_env() for _ in runs]
    obs = [env.reset(task, s) for env, (task, s) in zip(envs, runs, strict=True)]
    live = list(range(len(runs)))
    success = [False] * len(runs)
    while live:
        chunks = act(model, acts, [prompts[runs[i][0]] for i in live],
                     [obs[i]["image"] for i in live], [obs[i]["proprio"] for i in live],
                     temperature, generator)
        still = []
        for i, chunk in zip(live, chunks, strict=True):
            obs[i], _, done, info = envs[i].step(chunk)
            success[i] = bool(info["success"])
            if not done:
                still.append(i)
        live = still
    per_task = {task: float(np.mean([ok for (t, _), ok in zip(runs, success, strict=True)
                                     if t == task])) for task in TASK_IDS}
    return {"success": float(np.mean(success)), "tasks": per_task}


def evaluate(model, acts, prompts, args) -> dict:
    seeds = range(args.eval_seeds)  # training episodes use seeds from 1,000,000 on
    return {"greedy": play(model, acts, prompts, seeds, 0.0, args.seed),
            "sampled": play(model, acts, prompts, seeds, TEMPERATURE, args.seed)}


def summary(result: dict) -> str:
    return (f"greedy {result['greedy']['success']:.3f} sampled "
            f"{result['sampled']['success']:.3f}")


def per_task(result: dict) -> str:
    return "\n".join(f"  {task:18s} greedy {result['greedy']['tasks'][task]:.2f} sampled "
                     f"{result['sampled']['tasks'][task]:.2f}" for task in TASK_IDS)


# ------------------------------------------------------------------------- warm-up
class PositionProbe(torch.nn.Module):
    """Linear read-outs used only while warming up (not saved): every block's and the
    gripper's position from the image tokens, and the target block's position and offset
    from the gripper from the backbone's output at the proprio token (where the first
    action is predicted). Without them the policy learns to all but ignore the image: the
    instruction and the proprio alone lower the loss, and the image path's gradient
    through the backbone is too weak to teach the encoder to find the named block."""

    def __init__(self, model):
        super().__init__()
        cfg = model.config
        self.image = torch.nn.Linear(cfg.image_tokens * cfg.hidden_size, 10)
        self.policy = torch.nn.Linear(cfg.hidden_size, 4)
        self.tokens = self.hidden = None
        model.vision.register_forward_hook(self._keep_tokens)
        model.model.norm.register_forward_hook(self._keep_hidden)

    def _keep_tokens(self, _module, _inputs, output) -> None:
        self.tokens = output

    def _keep_hidden(self, _module, _inputs, output) -> None:
        self.hidden = output

    def loss(self, where: torch.Tensor) -> torch.Tensor:
        """After a ``bc_loss`` forward (the proprio token is the last before the chunk)."""
        image = F.mse_loss(self.image(self.tokens.flatten(1)), where[:, :10])
        policy = F.mse_loss(self.policy(self.hidden[:, -2 * CHUNK - 1]), where[:, 10:])
        return image + policy


def warm_up(model, acts, prompts, data, args, log) -> tuple[int, dict]:
    probe = PositionProbe(model)
    params = list(model.parameters()) + list(probe.parameters())
    opt = adamw(params, args.lr, args.wd)
    lr_at = warmup_cosine(args.lr, args.steps, warmup=20, floor=0.1)
    order = Shuffled(len(data["task"]), args.batch_size,
                     torch_permutation(torch.Generator().manual_seed(args.seed)))
    result: dict = {}
    for step in range(1, args.steps + 1):
        model.train()
        index = torch.tensor(order.next())
        batch = {k: v[index] for k, v in data.items()}
        loss = bc_loss(model, prompts, batch, args.label_sigma)
        aux = probe.loss(batch["where"])
        # the first aux_steps teach the encoder and backbone to find the named block only
        imitate = 0.0 if step <= args.aux_steps else 1.0
        optimiser_step(opt, imitate * loss + args.aux_weight * aux, lr_at(step - 1), clip=params)
        imitated = step - args.aux_steps
        if (imitated <= 0 or imitated % args.eval_every) and step != args.steps:
            continue
        result = evaluate(model, acts, prompts, args)
        log(f"step {step:4d} loss {loss.item():.3f} aux {aux.item():.4f} success "
            f"{summary(result)}")
    return args.steps, result


# -------------------------------------------------------------------------------- main
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ASSET_DIR)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=96)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--intermediate", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2000,
                    help="training steps (the learning-rate schedule's length)")
    ap.add_argument("--episodes", type=int, default=3000, help="scripted episodes")
    ap.add_argument("--noises", type=float, nargs="+", default=[0.0, 0.3, 0.6, 0.9],
                    help="the expert's action noise (standard deviation), per episode")
    ap.add_argument("--label-sigma", type=float, default=1.0,
                    help="spread of the targets over neighbouring bins (0: one-hot)")
    ap.add_argument("--aux-weight", type=float, default=1.0,
                    help="weight of the position read-out loss on the image tokens")
    ap.add_argument("--aux-steps", type=int, default=1000,
                    help="steps on the read-out losses alone before imitation starts")
    ap.add_argument("--eval-every", type=int, default=250,
                    help="imitation steps between progress checks (logged only)")
    ap.add_argument("--eval-seeds", type=int, default=50,
                    help="held-out seeds per task (the card's scores)")
    args = ap.parse_args(argv)

    log = timed_log()
    seeded(args.seed)
    tok = build_tokenizer()
    acts = action_tokenizer_for(tok, BINS)
    model = build_model(tok, args.hidden, args.layers, args.heads, args.head_dim,
                        args.intermediate)
    n_params = sum(p.numel() for p in model.parameters())
    prompts = {task: vla_prompt_ids(tok, Reach2D().reset(task, 0)["instruction"],
                                    model.config.image_tokens) for task in TASK_IDS}
    data = scripted_data(acts, args.episodes, args.noises, args.seed)
    log(f"vocab {len(tok)}, params {n_params:,}, {args.episodes} scripted episodes, "
        f"{len(data['task'])} steps")
    steps, result = warm_up(model, acts, prompts, data, args, log)
    log(f"trained {steps} steps: {summary(result)}\n{per_task(result)}")

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    save_tokenizer(tok, out)
    build_s = time.time() - log.t0
    info = dict(command=command_line("make_tiny_vla.py", argv), params=n_params, hidden=args.hidden,
                layers=args.layers, heads=args.heads, head_dim=args.head_dim,
                intermediate=args.intermediate, vocab=len(tok), seed=args.seed, steps=steps,
                lr=args.lr, wd=args.wd, label_sigma=args.label_sigma,
                aux_weight=args.aux_weight, aux_steps=args.aux_steps,
                schedule_steps=args.steps, batch_size=args.batch_size,
                episodes=args.episodes, samples=len(data["task"]), noises=args.noises,
                eval_seeds=args.eval_seeds, build_s=round(build_s), result=result)
    (out / "vla_envs.json").write_text(json.dumps(envs_record(), indent=2) + "\n")
    finish(out, card_text(info, prompts, tok), log)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
