"""The ``hf`` rollout's sampler against plain ``generate`` and the plain decoding loop.

    .venv/bin/python tools/bench/sampler.py [--rounds 20] [--model PATH] [--rows 256] \
        [--n 8] [--new-tokens 8] [--out bench_sampler.json] [key=value ...]

Same model, same batch, same process: the run's config (the main job's by default: the
built-in tiny model, 32 arithmetic prompts x 8 samples, 8 new tokens, one torch thread) and
its dataloader's prompts. Each round takes the next batch and runs, in a rotating order,
- generate: transformers ``model.generate`` of the repeated batch with the run's sampling;
- reference: the plain KV-cached loop (``siirl.engine.rollout.reference``);
- sampler: the loop the rollout uses (``siirl.engine.rollout.sampler.decode``);
- rollout node: ``HFRollout.generate`` of the batch (sampler plus the node's own work).
The first round warms up. Prints median seconds, response tokens/s (valid tokens, up to
and including EOS, of each method's own samples), the median per-round ratio to generate,
and the same in process CPU seconds (steadier than wall time on a shared machine, and
the same thing with one torch thread); checks that sampler and reference gave the same
tokens every round; writes JSON (with every round's figures).
``--model`` is ``actor_rollout_ref.model.path`` (an HF directory, a .gguf file, ``smollm2``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from bench_info import batches, write_result  # tools/bench is on sys.path when run as a script

METHODS = ("generate", "reference", "sampler", "rollout node")


def setup(run_dir: str, args, overrides: list):
    from siirl.dag_worker.walk.data_setup import build_dataloaders
    from siirl.dag_worker.walk.trainer_loop import configure_threads, seed_everything
    from siirl.engine.models.loader import load_model_and_tokenizer
    from siirl.engine.rollout.hf_rollout import HFRollout
    from siirl.params.parser import parse_config
    from siirl.params.typed import to_typed

    base = parse_config([f"trainer.default_local_dir={run_dir}", *overrides])
    n = args.n or int(base.actor_rollout_ref.rollout.n)
    rows = args.rows or int(base.data.train_batch_size) * n
    if rows % n:
        raise SystemExit(f"--rows {rows} is not a multiple of n={n}")
    sized = [f"data.train_batch_size={rows // n}", f"actor_rollout_ref.rollout.n={n}",
             f"actor_rollout_ref.actor.ppo_mini_batch_size={rows // n}"]
    if args.new_tokens:
        sized.append(f"data.max_response_length={args.new_tokens}")
    # typed once, as the launcher hands it on
    config = to_typed(parse_config([f"trainer.default_local_dir={run_dir}", *overrides, *sized]))
    configure_threads(config)
    seed_everything(int(config.trainer.seed))
    model, tokenizer = load_model_and_tokenizer(config.actor_rollout_ref.model)
    model.eval()
    loader, _ = build_dataloaders(config, tokenizer, 0, 1)
    engine = HFRollout(config=config, module=model, tokenizer=tokenizer)
    return config, model, tokenizer, loader, engine


def valid_tokens(tokens, width: int, eos_ids: list, pad_id: int) -> int:
    from siirl.engine.rollout.hf_rollout import postprocess_responses
    return int(postprocess_responses(tokens, width, eos_ids, pad_id)[1].sum().item())


def one_round(model, engine, batch, n: int, rotate: int) -> tuple[dict, dict, bool]:
    import torch

    from siirl.data_coordinator import protocol
    from siirl.engine.rollout.reference import reference_decode
    from siirl.engine.rollout.sampler import decode

    params = engine.sampling(False)
    params.pop("n")
    width = engine.max_response_length()
    eos_ids, pad_id = engine.token_ids(*engine.policy())
    rows = protocol.repeat_interleave(batch, n)
    ids, mask, pos = rows["input_ids"], rows["attention_mask"], rows["position_ids"]
    keys = engine.noise_keys(rows, n)
    args = (model, ids, mask, pos, width, eos_ids, pad_id)
    out = {}

    def run_generate():
        with torch.no_grad():
            seqs = model.generate(
                input_ids=ids, attention_mask=mask, do_sample=not params["greedy"],
                temperature=params["temperature"], top_k=max(params["top_k"], 0),
                top_p=params["top_p"], max_new_tokens=width, pad_token_id=pad_id,
                eos_token_id=eos_ids)
        out["generate"] = seqs[:, ids.shape[1]:]

    def run_reference():
        out["reference"] = reference_decode(*args, **params, keys=keys)

    def run_sampler():
        out["sampler"] = decode(*args, **params, keys=keys)

    def run_node():
        out["rollout node"] = engine.generate(batch).batch["responses"]

    runs = dict(zip(METHODS, (run_generate, run_reference, run_sampler, run_node), strict=True))
    order = METHODS[rotate % len(METHODS):] + METHODS[:rotate % len(METHODS)]
    seconds = {}
    for name in order:
        start, cpu = time.perf_counter(), time.process_time()
        runs[name]()
        seconds[name] = time.perf_counter() - start
        seconds[name + " cpu"] = time.process_time() - cpu
    tokens = {name: valid_tokens(out[name], width, eos_ids, pad_id) for name in METHODS}
    same = torch.equal(out["sampler"], out["reference"])
    return seconds, tokens, same


def run(args, overrides: list) -> dict:
    with tempfile.TemporaryDirectory() as run_dir:
        config, model, _, loader, engine = setup(run_dir, args, overrides)
        n = int(config.actor_rollout_ref.rollout.n)
        rounds, identical = [], 0
        for index, batch in enumerate(batches(loader, args.rounds)):
            seconds, tokens, same = one_round(model, engine, batch, n, index)
            identical += same
            rounds.append((seconds, tokens))
    measured = rounds[1:] or rounds  # round 1 warms up
    result = {"model": str(config.actor_rollout_ref.model.path or "builtin:tiny-arith"),
              "rows": int(config.data.train_batch_size) * n, "n": n,
              "new_tokens": int(config.data.max_response_length),
              "rounds_measured": len(measured), "overrides": overrides,
              "sampler_equals_reference": {"rounds": len(rounds), "identical": identical},
              "methods": {}, "rounds": [{"seconds": s, "tokens": t} for s, t in rounds]}
    for name in METHODS:
        secs = [s[name] for s, _ in measured]
        toks = [t[name] for _, t in measured]
        result["methods"][name] = {
            "median_s": statistics.median(secs),
            "median_cpu_s": statistics.median(s[name + " cpu"] for s, _ in measured),
            "tokens_per_s": sum(toks) / sum(secs),
            "ratio_to_generate": statistics.median(s[name] / s["generate"]
                                                   for s, _ in measured),
            "cpu_ratio_to_generate": statistics.median(
                s[name + " cpu"] / s["generate cpu"] for s, _ in measured),
        }
    return result


def report(result: dict) -> None:
    print(f"{result['model']}: {result['rows']} rows ({result['n']} per prompt), "
          f"{result['new_tokens']} new tokens, {result['rounds_measured']} rounds")
    print(f"{'method':<16}{'median s':>11}{'tokens/s':>11}{'/ generate':>12}"
          f"{'cpu s':>11}{'cpu / gen':>11}")
    for name, row in result["methods"].items():
        print(f"{name:<16}{row['median_s']:>11.4f}{row['tokens_per_s']:>11.0f}"
              f"{row['ratio_to_generate']:>12.2f}{row['median_cpu_s']:>11.4f}"
              f"{row['cpu_ratio_to_generate']:>11.2f}")
    same = result["sampler_equals_reference"]
    print(f"sampler tokens == reference tokens in {same['identical']} of {same['rounds']} "
          "rounds")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--model", default=None)
    parser.add_argument("--rows", type=int, default=None,
                        help="rows per call, prompts x n (default: the config's)")
    parser.add_argument("--n", type=int, default=None, help="samples per prompt")
    parser.add_argument("--new-tokens", type=int, default=None,
                        help="data.max_response_length (default: the config's)")
    parser.add_argument("--out", default="bench_sampler.json")
    args, overrides = parser.parse_known_args(argv)
    if args.model:
        overrides = [f"actor_rollout_ref.model.path={args.model}", *overrides]
    result = run(args, overrides)
    report(result)
    write_result(result, args.out, argv)
    same = result["sampler_equals_reference"]
    return 0 if same["identical"] == same["rounds"] else 1


if __name__ == "__main__":
    sys.exit(main())
