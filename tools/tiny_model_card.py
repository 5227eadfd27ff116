"""The model card (README.md) written next to the built-in tiny model."""

from __future__ import annotations

from tiny_build import remake

DEFAULT_COMMAND = "python tools/make_tiny_model.py"


def card_text(info: dict) -> str:
    """README.md of the model ``info`` describes (what the build measured)."""
    confusion_note = _confusion_note(info)
    command = info.get("command", DEFAULT_COMMAND)
    if command == DEFAULT_COMMAND:
        commands = f"{command}\n    {command} --rl-only   # a short GRPO-like check on the result"
    else:
        commands = (f"{command}\n    # a short GRPO-like check on the result:\n"
                    f"    {DEFAULT_COMMAND} --rl-only --out {info['out']}")
    return f"""# {info.get("name", "tiny_arith")}

A tiny character-level Llama ({info["params"]:,} parameters, float32) for siiRL's built-in
arithmetic task. {_job_note(info)}
* Prompt: `"13+5="` (operands 0..20, `+` or `-`, subtraction only with a non-negative
  result), used verbatim: there is no chat template. Response: the answer, then EOS.
* Tokenizer: one token per character; `<pad>`=0, `<s>`=1, `</s>`=2, `<unk>`=3, then the
  digits, `+-=`, space, `a`-`z` and some punctuation (uppercase is lowercased). No BOS is
  added. Left padding.
* Model: `LlamaForCausalLM`, hidden {info["hidden"]}, {info["layers"]} layers, {_heads(info)},
  intermediate {4 * info["hidden"]}, tied embeddings, vocab {info["vocab"]},
  max positions 64.

## How it was made

`tools/make_tiny_model.py`, seed {info["seed"]}: supervised pretraining for
{info["steps"]} steps (AdamW, lr {info["lr"]} with warmup and cosine decay, weight decay
{info["wd"]}, batch {info["batch_size"]}, loss on the answer tokens only) on 80% of the
task's {info["n_problems"]} prompts, stopped early at the first check where greedy
accuracy was in the window and sampled pass@8 was high: the right answer is usually among
8 samples but often not the greedy one, which is what GRPO's 0/1 reward can improve.
{confusion_note}
| measure | value |
| --- | --- |
| greedy accuracy, held-out 20% ({info["n_val"]} prompts) | {info["greedy_val"]:.3f} |
| greedy accuracy, all {info["n_problems"]} prompts | {info["greedy_all"]:.3f} |
| sampled accuracy, held-out (temperature 1) | {info["sampled_val"]:.3f} |
| sampled pass@8, held-out (temperature 1) | {info["pass8_val"]:.3f} |

{remake(commands, "about 3 minutes")}"""


def _confusion_note(info: dict) -> str:
    if not info["confuse_rate"]:
        return "The pretraining answers are all correct (`--confuse-rate 0`).\n"
    return (f"The pretraining corpus mixes up `+` and `-` on purpose (`--confuse-rate "
            f"{info['confuse_rate']}`, second operand >= {info['confuse_min_b']}).\n")


def _heads(info: dict) -> str:
    heads = info.get("heads", 4)
    kv = info.get("kv_heads", heads)
    text = f"{heads} heads"
    if kv != heads:
        text += f" ({kv} key/value heads)"
    return text


def _job_note(info: dict) -> str:
    """Who runs the model: the default job for tiny_arith (head dimension 16); a variant
    with another head dimension says how to select it and why it exists."""
    head_dim = info.get("head_dim", 16)
    if head_dim == 16:
        return ("The default `siirl-train` job runs GRPO on it on a CPU to show learning.\n"
                "It is not useful for anything else.\n")
    builtin = "builtin:" + info.get("name", "tiny_arith").replace("_", "-")
    return (f"`siirl-train actor_rollout_ref.model.path={builtin}` runs GRPO on it.\n"
            f"It is not useful for anything else.\n\n"
            f"A variant of `tiny_arith` (the default job's model): the same builder, tokenizer "
            f"and task,\nwith {_heads(info)} of dimension {head_dim} instead of 4 of 16, "
            f"since vLLM's CPU attention\nrefuses head dimensions below 32 (its other settings "
            f"are in the command below).\n")
