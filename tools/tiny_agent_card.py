"""The model card (``README.md``) of the built-in tiny agent, written by
``tools/make_tiny_agent.py`` from what the build measured."""

from __future__ import annotations

import json

from tiny_build import remake


def card_text(info: dict, envs_used: dict, words: list, manager: dict) -> str:
    """README.md from the build's ``info`` and the settings it trained with."""
    rows = "\n".join(
        f"| {key.split('/')[0]} | {key.split('/')[1]} | "
        f"{r['success']:.3f} | {r['format_errors']:.3f} | {r['tokens_mean']:.0f} | "
        f"{r['tokens_max']} |" for key, r in info["result"].items())
    envs = "\n".join(f"      {tag}:\n        env_type: {e['env_type']}\n"
                     f"        env_instruction: {e['env_instruction']}\n"
                     f"        env_config: {json.dumps(e['env_config'])}"
                     for tag, e in envs_used.items())
    shape = (f'hidden {info["hidden"]}, {info["layers"]} layers, {info["heads"]} heads of '
             f'dimension {info["head_dim"]}')
    lengths = (f'{info["scripted_tokens_mean"]} tokens on average and '
               f'{info["scripted_tokens_max"]} at most')
    took = f'{info["build_s"]} s here, on a shared\n2-core machine'
    return f"""# tiny_agent

`builtin:tiny-agent`: a tiny Llama ({info["params"]:,} parameters, float32) that plays
FrozenLake and Sokoban through siiRL's AGENTIC pipeline, as it comes out of a supervised
warm-up on scripted episodes (nothing weakens it afterwards). The AGENTIC presets train it on
variants it was never taught. It is not useful for anything else.

* Episodes as the trajectory env manager builds them without a chat template: the
  one-word instruction, a newline and the grid; then per turn the reply
  `<answer>Left</answer></s>` and `\\n` + the next grid + `\\n`.
* Tokenizer (word level): `<pad>`=0, `<s>`=1, `</s>`=2, `<unk>`=3; these words are one
  token each: {", ".join(f"`{w}`" for w in words)};
  every other printable ASCII character is one token (grid symbols, digits, space,
  newline). No BOS, no chat template, left padding.
* Model: `LlamaForCausalLM`, {shape}
  (vLLM's CPU attention accepts it), intermediate {4 * info["hidden"]}, tied embeddings,
  vocab {info["vocab"]}, max positions {manager["max_episode_tokens"]}.

## Settings it was trained with (use them verbatim; also in `agent_envs.json`)

    custom_envs:
{envs}
    env_manager:
      max_actions_per_traj: {manager["max_actions_per_traj"]}
      max_tokens_per_step: {manager["max_tokens_per_step"]}
      max_episode_tokens: {manager["max_episode_tokens"]}

`env_instruction` replaces the environments' long default instructions with one word;
with the default ones the prompts are out of distribution (and much longer).

## How it was made

`tools/make_tiny_agent.py`, seed {info["seed"]}: {info["episodes"]} scripted episodes
({info["counts"]}; seeds from 1,000,000 on), played
by the environments' breadth-first solvers with random actions mixed in (per episode,
probability 0 to 0.6), {lengths}; supervised
warm-up on the agent's tokens only (a random action's word excluded), AdamW lr
{info["lr"]}, weight decay {info["wd"]}, batch {info["batch_size"]} episodes, {info["steps"]} steps.

The warm-up runs its whole cosine schedule (warm-up 20 steps, down to a tenth of the peak);
the model is saved as it ends. The build checks only that it learned the tasks: greedy
success at least {info["greedy_lo"]} and few format errors.

## Scores before any RL

Held-out seeds 0..{info["eval_episodes"] - 1} per environment (sampled: temperature 1, top-k
and top-p off), success, format errors per reply and episode lengths:

| environment | decoding | success | format errors | tokens mean | tokens max |
| --- | --- | --- | --- | --- | --- |
{rows}

For reference, uniformly random actions succeed in about 1% of these FrozenLake maps and
about 20% of these Sokoban puzzles (they are small), and the solvers in all of them within
8 actions (Sokoban: about 95%).

{remake(info["command"], took)}"""
