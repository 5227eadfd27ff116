"""siiRL's training step against its floor, side by side in one process.

    .venv/bin/python tools/bench/step_floor.py [--rounds 8] [--model PATH] \
        [--out bench_step_floor.json] [key=value ...]

The floor is what a step cannot avoid on the same model, batch and settings: one plain
transformers ``generate`` of the batch (``rollout.n`` samples per prompt, the run's response
length, sampling), then one forward/backward of the policy on the generated sequences
without activation checkpointing, then one fused AdamW step. Rounds alternate a siiRL step
(the real DAGWorker over the real graph, same code as ``siirl-train``) and a floor step on
the same prompts; the first round is a warm-up. Prints per-node medians, the floor's parts,
the ratio siiRL / floor (median over rounds), start-up times (imports, set-up, first step)
and the process's peak RSS; writes JSON. ``--model`` sets ``actor_rollout_ref.model.path``
(a local HF directory, a .gguf file or ``smollm2``).
"""

from __future__ import annotations

import argparse
import copy
import resource
import statistics
import sys
import tempfile
import time

STARTED = time.perf_counter()

from bench_info import write_result  # noqa: E402  (after the clock starts; tools/bench on path)


def build_worker(run_dir: str, rounds: int, overrides: list):
    from siirl.dag_worker.dagworker import DAGWorker
    from siirl.dag_worker.walk.trainer_loop import configure_threads, seed_everything
    from siirl.execution.dag.task_loader import load_pipeline
    from siirl.params.parser import parse_config

    config = parse_config([f"trainer.default_local_dir={run_dir}",
                           f"trainer.total_training_steps={rounds}", "trainer.test_freq=-1",
                           "trainer.val_before_train=false", "trainer.save_freq=-1",
                           "trainer.logger=[]", *overrides])
    configure_threads(config)
    seed_everything(int(config.trainer.seed))
    worker = DAGWorker(load_pipeline(config), config)
    worker.setup()
    worker.set_total_training_steps(rounds)
    return config, worker


class Floor:
    """Plain generate + one eager training step of a copy of the policy."""

    def __init__(self, module, tokenizer, config):
        import torch

        self.torch = torch
        self.model = copy.deepcopy(module)
        # the floor recomputes nothing (transformers 5 renamed the method)
        disable = getattr(self.model, "activation_checkpointing_disable", None) or \
            getattr(self.model, "gradient_checkpointing_disable", None)
        if disable is not None:
            disable()
        params = [p for p in self.model.parameters() if p.requires_grad]
        try:
            self.optimizer = torch.optim.AdamW(params, lr=1e-6, fused=True)
        except (RuntimeError, ValueError, TypeError):
            self.optimizer = torch.optim.AdamW(params, lr=1e-6)
        self.n = int(config.actor_rollout_ref.rollout.n)
        self.response_length = int(config.data.max_response_length)
        self.pad = tokenizer.pad_token_id
        self.eos = tokenizer.eos_token_id

    def step(self, batch) -> dict:
        torch = self.torch
        device = next(self.model.parameters()).device
        ids = batch["input_ids"].repeat_interleave(self.n, dim=0).to(device)
        mask = batch["attention_mask"].repeat_interleave(self.n, dim=0).to(device)
        start = time.perf_counter()
        self.model.eval()
        with torch.no_grad():
            seqs = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=True,
                                       temperature=1.0, top_k=0, top_p=1.0,
                                       max_new_tokens=self.response_length,
                                       pad_token_id=self.pad, eos_token_id=self.eos)
        generated = time.perf_counter()
        responses = seqs[:, ids.shape[1]:]
        response_mask = (responses != self.pad).float()
        full_mask = torch.cat([mask, response_mask.long()], dim=1)
        self.model.train()
        logits = self.model(input_ids=seqs, attention_mask=full_mask).logits
        logits = logits[:, ids.shape[1] - 1:-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, responses[..., None])[..., 0]
        loss = -(logp * response_mask).sum() / response_mask.sum().clamp_min(1)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        done = time.perf_counter()
        return {"generate": generated - start, "train": done - generated,
                "step": done - start}


def median_of(rows: list, key: str) -> float:
    values = [row[key] for row in rows if key in row]
    return statistics.median(values) if values else 0.0


def run(rounds: int, overrides: list) -> dict:
    import siirl.dag_worker.dagworker  # noqa: F401  (torch, tensordict, hydra, ray)
    import siirl.engine.fsdp.engines  # noqa: F401  (transformers)

    imported = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        t0 = time.perf_counter()
        config, worker = build_worker(run_dir, rounds, overrides)
        set_up = time.perf_counter()
        floor = Floor(worker.engines.actor.module, worker.tokenizer, config)
        batches = iter(worker.train_loader)
        siirl_rows, floor_rows = [], []
        first_step = None
        for index in range(rounds):
            batch = next(batches)
            worker.global_step = index + 1
            result = worker.execute_task_graph(batch.clone(), next_batch=lambda: next(batches))
            if first_step is None:
                first_step = time.perf_counter() - set_up
            siirl_rows.append({k.split("/", 1)[1]: v for k, v in result.metrics.items()
                               if k.startswith("timing_s/")})
            floor_rows.append(floor.step(batch))
    siirl_rows, floor_rows = siirl_rows[1:], floor_rows[1:]  # round 1 warms up
    ratios = [s["step"] / f["step"] for s, f in zip(siirl_rows, floor_rows, strict=True)]
    nodes = sorted({k for row in siirl_rows for k in row} - {"step"})
    step = median_of(siirl_rows, "step")
    return {
        "rounds_measured": len(ratios), "overrides": overrides,
        "siirl_step_s": step, "floor_step_s": median_of(floor_rows, "step"),
        "ratio_median": statistics.median(ratios) if ratios else None,
        "nodes": {n: {"seconds": median_of(siirl_rows, n),
                      "share": median_of(siirl_rows, n) / step if step else 0.0}
                  for n in nodes},
        "floor": {k: median_of(floor_rows, k) for k in ("generate", "train")},
        "startup_s": {"imports": imported - STARTED, "setup": set_up - t0,
                      "first_step": first_step, "to_first_step": t0 - STARTED
                      + (set_up - t0) + (first_step or 0.0)},
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def report(result: dict) -> None:
    print(f"{'node (median s)':<28}{'siiRL':>10}{'share':>8}")
    for node, split in result["nodes"].items():
        print(f"{node:<28}{split['seconds']:>10.4f}{split['share']:>8.1%}")
    print(f"{'step':<28}{result['siirl_step_s']:>10.4f}")
    print(f"\n{'floor (median s)':<28}{'floor':>10}")
    for part, seconds in result["floor"].items():
        print(f"{part:<28}{seconds:>10.4f}")
    print(f"{'step':<28}{result['floor_step_s']:>10.4f}")
    print(f"\nsiiRL step / floor step (median of {result['rounds_measured']} rounds): "
          f"{result['ratio_median']:.2f}")
    startup = result["startup_s"]
    print(f"start-up: imports {startup['imports']:.1f} s, set-up {startup['setup']:.1f} s, "
          f"first step {startup['first_step']:.1f} s; to first step "
          f"{startup['to_first_step']:.1f} s")
    print(f"peak RSS of the process (siiRL and floor together): {result['peak_rss_mb']:.0f} MB")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", default="bench_step_floor.json")
    args, overrides = parser.parse_known_args(argv)
    if args.model:
        overrides = [f"actor_rollout_ref.model.path={args.model}", *overrides]
    result = run(max(2, args.rounds), overrides)
    report(result)
    write_result(result, args.out, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
