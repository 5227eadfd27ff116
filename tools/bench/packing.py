"""The actor's log-prob forward + backward with padded rows against packed rows
(``actor_rollout_ref.model.use_remove_padding``), on a length-skewed batch.

    python tools/bench/packing.py [--rows 32] [--long 4] [--micro 8] [--rounds 5]
                                  [--models tiny,llama30m] [--threads 1]
                                  [--out docs/bench/packing.json]

The batch is what a rollout of short answers with a few long ones looks like: ``--rows``
rows, prompts of 8 to 48 tokens left-padded to 48, responses of 8 to 40 tokens except
``--long`` rows of 400 to 464, right-padded to 464; rows shuffled (seeded), so the long
ones land in different micro-batches. Each round runs the actor's head
(``siirl.engine.fsdp.engines.logprob_heads``) on every micro-batch of ``--micro`` rows and
backpropagates the log-probs and entropy: once padded (which already trims the columns no
row of a micro-batch uses), once packed. The two alternate within a round, so both see the
same machine load; the first round warms up and is not counted.

Models: ``tiny`` is the built-in tiny model (hidden 64, 3 layers, vocabulary 58);
``llama30m`` a Llama built from a config (hidden 512, 4 layers, vocabulary 32000, tied
head, about 29M parameters), fp32, default attention (sdpa). The table shows per model the
tokens each layout runs through the model, the median seconds per round of both, and
packed / padded; and the largest log-prob difference between the two (a check, not a
timing). ``--threads`` sets torch's CPU threads (1 by default: on a shared machine more
threads than free cores make every kernel wait on the slowest).
"""

from __future__ import annotations

import argparse
import os
import time

from bench_info import write_result  # tools/bench is on sys.path when run as a script

PROMPT, SHORT, LONG = 48, (8, 40), (400, 464)
MODELS = ("tiny", "llama30m")


def _model(name: str):
    import torch

    torch.manual_seed(0)
    if name == "tiny":
        from siirl.engine.models.loader import load_model
        from siirl.params import ModelArguments

        return load_model(ModelArguments(path=None), dtype=torch.float32)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1376,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                         max_position_embeddings=PROMPT + LONG[1], tie_word_embeddings=True)
    return LlamaForCausalLM(config).float()


def skewed_batch(rows: int, long_rows: int, vocab: int, seed: int = 0) -> dict:
    """Left-padded prompts and right-padded responses, ``long_rows`` of them long."""
    import torch

    g = torch.Generator().manual_seed(seed)
    width = PROMPT + LONG[1]
    ids = torch.zeros(rows, width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row in range(rows):
        plen = int(torch.randint(8, PROMPT + 1, (1,), generator=g))
        low, high = LONG if row < long_rows else SHORT
        rlen = int(torch.randint(low, high + 1, (1,), generator=g))
        mask[row, PROMPT - plen:PROMPT + rlen] = 1
    ids = torch.where(mask.bool(), torch.randint(3, vocab, ids.shape, generator=g), ids)
    order = torch.randperm(rows, generator=g)
    ids, mask = ids[order], mask[order]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": pos,
            "response_length": LONG[1]}


def _micro_batches(batch: dict, micro: int):
    from siirl.data_coordinator.protocol import make_batch

    rows = batch["input_ids"].shape[0]
    for start in range(0, rows, micro):
        yield make_batch({k: batch[k][start:start + micro]
                          for k in ("input_ids", "attention_mask", "position_ids")})


def _tokens_run(batch: dict, micro: int, packed: bool) -> int:
    """Tokens through the model per round: the used columns of each micro-batch (padded)
    or its attended tokens (packed)."""
    from siirl.engine.models.padding import used_columns

    total = 0
    for part in _micro_batches(batch, micro):
        mask = part["attention_mask"]
        if packed:
            total += int(mask.sum())
        else:
            cols = used_columns(mask, batch["response_length"])
            total += mask.shape[0] * (cols.stop - cols.start)
    return total


def _round(model, head, parts) -> tuple:
    start = time.perf_counter()
    model.zero_grad(set_to_none=True)
    outputs = []
    for part in parts:
        out = head.fn(model, part)
        (out["log_probs"].sum() + out["entropy"].sum()).backward()
        outputs.append(out["log_probs"].detach())
    return time.perf_counter() - start, outputs


def run_model(name: str, rows: int, long_rows: int, micro: int, rounds: int) -> dict:
    import torch

    from siirl.engine.fsdp.engines import logprob_heads

    model = _model(name)
    batch = skewed_batch(rows, long_rows, model.config.vocab_size)
    parts = list(_micro_batches(batch, micro))
    heads = {"padded": logprob_heads()(batch["response_length"], 1.0, True),
             "packed": logprob_heads(remove_padding=True)(batch["response_length"], 1.0, True)}
    seconds = {layout: [] for layout in heads}
    diff = size = 0.0
    for index in range(rounds + 1):
        got = {}
        for layout, head in heads.items():
            took, got[layout] = _round(model, head, parts)
            if index:  # round 0 warms up
                seconds[layout].append(took)
        diff = max(diff, max(float((a - b).abs().max())
                             for a, b in zip(got["padded"], got["packed"], strict=True)))
        size = max(size, max(float(a.abs().max()) for a in got["padded"]))
    median = {k: sorted(v)[len(v) // 2] for k, v in seconds.items()}
    mask = batch["attention_mask"]
    return {"model": name, "params": sum(p.numel() for p in model.parameters()),
            "attended_tokens": int(mask.sum()), "batch_tokens": mask.numel(),
            "tokens_run": {layout: _tokens_run(batch, micro, layout == "packed")
                           for layout in heads},
            "median_s": median, "packed_over_padded": median["packed"] / median["padded"],
            "max_abs_logprob_diff": diff, "max_abs_logprob": size, "width": mask.shape[1],
            "threads": torch.get_num_threads()}


def main(argv: list | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--long", type=int, default=4, help="rows with a long response")
    parser.add_argument("--micro", type=int, default=8, help="rows per micro-batch")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds per layout")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", default="docs/bench/packing.json")
    args = parser.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"--models: unknown {unknown}; choose from {list(MODELS)}")
    import torch

    torch.set_num_threads(max(1, args.threads))
    cases = [run_model(name, args.rows, args.long, args.micro, args.rounds) for name in names]
    print(f"{'model':<10}{'params':>12}{'tokens padded':>15}{'tokens packed':>15}"
          f"{'padded s':>10}{'packed s':>10}{'packed/padded':>15}{'max |dlogp|':>13}")
    for c in cases:
        print(f"{c['model']:<10}{c['params']:>12,}{c['tokens_run']['padded']:>15,}"
              f"{c['tokens_run']['packed']:>15,}{c['median_s']['padded']:>10.3f}"
              f"{c['median_s']['packed']:>10.3f}{c['packed_over_padded']:>15.2f}"
              f"{c['max_abs_logprob_diff']:>13.1e}")
    result = {"what": "actor log-prob forward + backward (log-probs and entropy), padded "
                      "rows (unused columns trimmed) vs packed rows",
              "batch": f"{args.rows} rows: prompts {8}-{PROMPT} tokens left-padded to "
                       f"{PROMPT}, responses {SHORT[0]}-{SHORT[1]} tokens except {args.long} "
                       f"of {LONG[0]}-{LONG[1]}, right-padded to {LONG[1]}; shuffled; "
                       f"micro-batches of {args.micro}",
              "rounds_measured": args.rounds, "cases": cases}
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    write_result(result, args.out, argv)


if __name__ == "__main__":
    main()
