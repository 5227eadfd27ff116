"""The ``vllm`` rollout node against standalone vLLM and against the ``hf`` rollout node.

    .venv-vllm/bin/python tools/bench/rollout.py [--rounds 10] [--model PATH] \
        [--prompts 32] [--out bench_rollout.json] [key=value ...]

Same process, same prompts, same sampling: the run's config (the main job's with
``rollout.name=vllm`` and ``rollout.dtype=float32``; by default the built-in
``builtin:tiny-arith-hd32``, 32 arithmetic prompts x 8 samples, 8 new tokens, temperature
1, one torch thread) and its dataloader's prompts. One ``vllm.LLM`` is started from the
config (``siirl.engine.rollout.vllm_engine``) and gets the fsdp actor's weights once. Each
round takes the next batch and runs, in a rotating order,
- standalone vllm: that ``LLM``'s ``generate`` of the prompts' token ids, called as a vLLM
  user would (one request per prompt with ``n`` samples, log-probs of the sampled tokens);
- vllm node: ``VLLMRollout.generate`` of the batch on the same ``LLM`` (the default: one
  seed per prompt);
- vllm node, seed per call: the same with ``rollout.seed_per_prompt=false``;
- hf node: ``HFRollout.generate`` of the batch with the same actor.
The first round warms up. Prints median seconds per batch (wall and process CPU), median
valid tokens/s (up to and including EOS, of each method's own samples) and the median
per-round tokens/s ratios vllm node / standalone vllm and vllm node / hf node; writes JSON
(with every round's figures). ``--model`` is ``actor_rollout_ref.model.path``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time

from bench_info import batches, write_result  # tools/bench is on sys.path when run as a script

SEED_PER_CALL = "vllm node, seed per call"
METHODS = ("standalone vllm", "vllm node", SEED_PER_CALL, "hf node")
RATIOS = {"vllm node / standalone vllm": ("vllm node", "standalone vllm"),
          f"{SEED_PER_CALL} / standalone vllm": (SEED_PER_CALL, "standalone vllm"),
          "vllm node / hf node": ("vllm node", "hf node")}
DEFAULT_MODEL = "builtin:tiny-arith-hd32"
FIXED = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.dtype=float32"]


def valid_count(token_ids, eos_ids, width: int) -> int:
    """Tokens of one sample up to and including its first EOS, at most ``width``."""
    ids = list(token_ids)[:width]
    for index, token in enumerate(ids):
        if token in eos_ids:
            return index + 1
    return len(ids)


def summarize(rounds: list, warmup: int = 1) -> dict:
    """Per method median seconds, CPU seconds and tokens/s over the rounds after
    ``warmup``, and the median per-round tokens/s ratios of ``RATIOS``."""
    measured = rounds[warmup:] or rounds

    def rate(one, name):
        return one["tokens"][name] / one["seconds"][name]

    methods = {name: {"median_s": statistics.median(r["seconds"][name] for r in measured),
                      "median_cpu_s": statistics.median(r["cpu_seconds"][name]
                                                        for r in measured),
                      "tokens_per_s": statistics.median(rate(r, name) for r in measured),
                      "median_tokens": statistics.median(r["tokens"][name] for r in measured)}
               for name in METHODS}
    ratios = {label: statistics.median(rate(r, top) / rate(r, bottom) for r in measured)
              for label, (top, bottom) in RATIOS.items()}
    return {"rounds_measured": len(measured), "methods": methods, "ratios": ratios}


def setup(run_dir: str, args, overrides: list):
    from transformers import AutoConfig

    from siirl.dag_worker.walk.data_setup import build_dataloaders
    from siirl.dag_worker.walk.trainer_loop import configure_threads, seed_everything
    from siirl.engine.common.runtime import resolve_device
    from siirl.engine.common.weight_sync import DEFAULT_BUCKET_BYTES
    from siirl.engine.fsdp.engines import fsdp_actor
    from siirl.engine.rollout import vllm_engine
    from siirl.engine.rollout.hf_rollout import HFRollout
    from siirl.engine.rollout.vllm_rollout import VLLMRollout
    from siirl.params.parser import parse_config
    from siirl.params.typed import to_typed

    sized = [f"data.train_batch_size={args.prompts}",
             f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}"] \
        if args.prompts else []
    # typed once, as the launcher hands it on
    config = to_typed(parse_config(
        [f"trainer.default_local_dir={run_dir}", *FIXED, *sized, *overrides]))
    configure_threads(config)
    seed_everything(int(config.trainer.seed))
    actor = fsdp_actor(config)
    model_path = config.actor_rollout_ref.model.path
    model_dir = vllm_engine.model_directory(model_path)
    hf_config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    device = resolve_device(config).type
    vllm_engine.check_model(hf_config, model_path, device)
    llm = vllm_engine.start_engine(
        vllm_engine.engine_kwargs(config, hf_config, model_dir, device)[0], model_path)
    node = VLLMRollout(config=config, peers={"actor": actor}, llm=llm)
    node.load_weights(actor.export_weights(DEFAULT_BUCKET_BYTES))  # dummy start: sync once
    per_call = copy.deepcopy(config)
    per_call.actor_rollout_ref.rollout.seed_per_prompt = False
    per_call_node = VLLMRollout(config=per_call, peers={"actor": actor}, llm=llm)
    per_call_node.needs_weights = False  # the engine it shares has the weights
    hf_node = HFRollout(config=config, peers={"actor": actor})
    loader, _ = build_dataloaders(config, actor.tokenizer, 0, 1)
    return config, llm, (node, per_call_node), hf_node, loader


def one_round(llm, nodes, hf_node, batch, rotate: int) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    node, per_call_node = nodes
    params = node.sampling(False)
    width = node.max_response_length()
    eos_ids, _ = node.stop_ids(node.actor.module, node.actor.tokenizer)
    # what a vLLM user holds already: the prompts' token ids and one SamplingParams
    prompts = [TokensPrompt(prompt_token_ids=row[mask.bool()].tolist())
               for row, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)]
    sampling = SamplingParams(n=params["n"], temperature=params["temperature"],
                              max_tokens=width, logprobs=0, detokenize=False,
                              stop_token_ids=list(eos_ids))
    inputs = {name: batch.clone() for name in METHODS[1:]}  # not timed
    out = {}

    def standalone():
        out["standalone vllm"] = llm.generate(prompts, sampling, use_tqdm=False)

    def vllm_node():
        out["vllm node"] = node.generate(inputs["vllm node"]).batch

    def per_call():
        out[SEED_PER_CALL] = per_call_node.generate(inputs[SEED_PER_CALL]).batch

    def hf():
        out["hf node"] = hf_node.generate(inputs["hf node"]).batch

    runs = dict(zip(METHODS, (standalone, vllm_node, per_call, hf), strict=True))
    order = METHODS[rotate % len(METHODS):] + METHODS[:rotate % len(METHODS)]
    seconds, cpu_seconds = {}, {}
    for name in order:
        start, cpu = time.perf_counter(), time.process_time()
        runs[name]()
        seconds[name] = time.perf_counter() - start
        cpu_seconds[name] = time.process_time() - cpu
    tokens = {"standalone vllm": sum(valid_count(sample.token_ids, eos_ids, width)
                                     for result in out["standalone vllm"]
                                     for sample in result.outputs)}
    for name in METHODS[1:]:
        tokens[name] = int(out[name]["response_mask"].sum().item())
    return {"order": list(order), "seconds": seconds, "cpu_seconds": cpu_seconds,
            "tokens": tokens}


def run(args, overrides: list) -> dict:
    import torch

    with tempfile.TemporaryDirectory() as run_dir:
        config, llm, nodes, hf_node, loader = setup(run_dir, args, overrides)
        rounds = [one_round(llm, nodes, hf_node, batch, index)
                  for index, batch in enumerate(batches(loader, args.rounds))]
    n = int(config.actor_rollout_ref.rollout.n)
    result = {"model": str(config.actor_rollout_ref.model.path),
              "prompts": int(config.data.train_batch_size), "n": n,
              "new_tokens": int(config.data.max_response_length),
              "temperature": float(config.actor_rollout_ref.rollout.temperature),
              "torch_threads": torch.get_num_threads(), "overrides": overrides}
    result.update(summarize(rounds))
    result["rounds"] = rounds
    result["vllm"] = sys.modules["vllm"].__version__
    return result


def report(result: dict) -> None:
    print(f"{result['model']}: {result['prompts']} prompts x {result['n']} samples, "
          f"{result['new_tokens']} new tokens, temperature {result['temperature']}, "
          f"{result['torch_threads']} torch thread(s), {result['rounds_measured']} rounds")
    print(f"{'method':<26}{'median s':>11}{'cpu s':>11}{'tokens':>9}{'tokens/s':>11}")
    for name, row in result["methods"].items():
        print(f"{name:<26}{row['median_s']:>11.4f}{row['median_cpu_s']:>11.4f}"
              f"{row['median_tokens']:>9.0f}{row['tokens_per_s']:>11.0f}")
    for label, value in result["ratios"].items():
        print(f"tokens/s {label}: {value:.2f} (median per round)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--prompts", type=int, default=None,
                        help="prompts per batch (default: the config's train_batch_size)")
    parser.add_argument("--out", default="bench_rollout.json")
    args, overrides = parser.parse_known_args(argv)
    overrides = [f"actor_rollout_ref.model.path={args.model}", *overrides]
    result = run(args, overrides)
    report(result)
    write_result(result, args.out, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
