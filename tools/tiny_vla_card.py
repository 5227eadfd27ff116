"""The built-in tiny VLA's settings (what the EMBODIED presets use verbatim; written to
``vla_envs.json`` next to the weights) and its model card, for ``tools/make_tiny_vla.py``."""

from __future__ import annotations

import json

from tiny_build import remake

from siirl.environment.embodied.tasks.reach2d import TASKS

WORDS = ["reach", "push", "the", "block", "to", "left", "right", "top", "bottom",
         "red", "green", "blue", "yellow"]
BINS = 256
GRID = 4  # the image is GRID * GRID tokens
# the settings the model is trained with, for the presets to use verbatim
ENV = {"env_type": "reach", "env_config": {"image_size": 64, "max_steps": 48,
                                           "max_delta": 0.06}}
CHUNK = 4  # actions per step: CHUNK * 2 action tokens
TEMPERATURE = 1.0
TASK_IDS = list(TASKS)


def envs_record() -> dict:
    """What the presets need, under ``actor_rollout_ref.embodied``'s names."""
    return {"env": {**ENV, "env_name": ",".join(TASK_IDS)},
            "action_chunks_len": CHUNK, "action_token_len": 2, "action_bins": BINS,
            "temperature": TEMPERATURE, "image_tokens": GRID * GRID,
            "prompt": "instruction ids + <image> * image_tokens + <proprio> (no BOS)",
            "response": "ActionTokenizer(len(tokenizer), 256).encode(chunk.reshape(-1)): "
                        "action_chunks_len * action_token_len tokens, no EOS"}


def card_text(info: dict, prompts: dict, tok) -> str:
    """README.md from the build's ``info``, with a prompt shown as tokens."""
    result = info["result"]
    rows = "\n".join(f"| {task} | {result['greedy']['tasks'][task]:.2f} | "
                     f"{result['sampled']['tasks'][task]:.2f} |" for task in TASK_IDS)
    example = tok.convert_ids_to_tokens(prompts["reach_red"])
    shown = " ".join(example[:7]).replace("   ", " ␣ ") + f" <image>×{GRID * GRID} <proprio>"
    cfg = ENV["env_config"]
    took = f'{info["build_s"]} s here, on a shared\n2-core machine'
    return f"""# tiny_vla

`builtin:tiny-vla`: a tiny vision-language-action model ({info["params"]:,} parameters,
float32) that plays the built-in `reach` tasks (Reach2D: reach a coloured block, or push
one past a line): it reaches almost always and pushes rarely (RL has not yet taught it to
push: `docs/embodied.md`). It is not useful for anything else.

* Model (`TinyVLAForActionPrediction`, `model_type` `siirl_tiny_vla`, in
  `siirl/engine/models/tiny_vla.py`; `import siirl.engine.models.loader` registers it with
  `AutoModelForCausalLM`): three stride-2 convolutions over RGB + x/y coordinate channels,
  average-pooled to a {GRID}x{GRID} grid and projected to {GRID * GRID} tokens; a linear map
  of the proprio vector (gripper x, y, velocity x, y) to one token; a Llama backbone
  (hidden {info["hidden"]}, {info["layers"]} layers, {info["heads"]} heads of dimension
  {info["head_dim"]}, intermediate {info["intermediate"]}, tied embeddings, vocab
  {info["vocab"]}). Only the last {BINS} ids get real logits; all others are -1e9.
* Prompt of one chunk step (no BOS, no chat template, left padding): the instruction's
  ids, {GRID * GRID} `<image>` placeholders, one `<proprio>` placeholder, e.g.
  `{shown}`.
  Pass the camera image as `pixel_values` (uint8 `[B, H, W, 3]`) and the proprio as
  `proprio` (`[B, 4]`) with the ids.
* Response: the chunk of {CHUNK} actions as {CHUNK * 2} action tokens
  (`ActionTokenizer(len(tokenizer), 256)`, bin `i` = id `vocab - 1 - i` = `<a{{i}}>`),
  action by action, no EOS; sample at temperature {TEMPERATURE}.
* Tokenizer (word level): `<pad>`=0, `<s>`=1, `</s>`=2, `<unk>`=3, `<image>`, `<proprio>`;
  these words are one token each:
  {", ".join(f"`{w}`" for w in WORDS)};
  every other printable ASCII character is one token; the {BINS} action tokens last.

## Settings it was trained with (use them verbatim; also in `vla_envs.json`)

    env_type: {ENV["env_type"]}
    env_name: {",".join(TASK_IDS)}
    env_config: {json.dumps(cfg)}
    action_chunks_len: {CHUNK}
    action_token_len: 2
    temperature: {TEMPERATURE}

## How it was made

`tools/make_tiny_vla.py`, seed {info["seed"]}: {info["episodes"]} episodes of the scripted
expert (the tasks in turn, seeds from 1,000,000 on) acting with Gaussian noise of standard
deviation {", ".join(map(str, info["noises"]))} (in turn per episode), {info["samples"]} visited
states, each labelled with the expert's noise-free chunk from that state (DART). AdamW lr
{info["lr"]} (cosine over {info["schedule_steps"]} steps), weight decay {info["wd"]}, batch
{info["batch_size"]} states. First {info["aux_steps"]} steps on auxiliary read-outs only
(linear probes, not saved: the blocks' and gripper's positions from the image tokens, the
named block's position and offset from the backbone's output at the proprio token; without
them the policy ignores the image), then cross-entropy on the action tokens (targets spread
over neighbouring bins, sigma {info["label_sigma"]} bins) with the read-outs kept on, for
the whole schedule: {info["steps"]} steps in all. Nothing was chosen by its scores: no early
stop, no softening afterwards. Pushing is much harder than reaching and stays rare.

Before any RL, on held-out seeds 0..{info["eval_seeds"] - 1} per task ({info["eval_seeds"]}
episodes per task, {info["eval_seeds"] * len(TASK_IDS)} in all): greedy
{result["greedy"]["success"]:.3f}, sampled (temperature 1) {result["sampled"]["success"]:.3f}.

| task | greedy | sampled |
| --- | --- | --- |
{rows}

## Fine-tuning it with RL

It reaches already, so the plain reach tasks leave RL little to teach. siiRL's embodied
presets (`configs/embodied_grpo.yaml`, `configs/embodied_srpo.yaml`, lr 3e-4) put it on a
robot whose x axis is mirrored (`actor_rollout_ref.embodied.env.action_signs: [-1, 1]`),
where it starts near zero, and RL adapts it; the push tasks it completes rarely, and RL
there found too few successes to learn from. Measured curves, greedy and sampled:
`docs/embodied.md` in the siiRL repository.

{remake(info["command"], took)}"""
