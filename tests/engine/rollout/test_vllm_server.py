"""The ``vllm`` rollout in server mode: real ``vllm serve`` processes on the CPU.

A 4-step GRPO run through the CLI against the worker's server; after a weight sync the
server's greedy responses equal the ``hf`` rollout's and its log-probs the actor's; a
crashed server is restarted once (with the latest weights), a second crash stops the run;
a server that cannot start fails with its log tail, and no server process outlives any of
this. Runs where vLLM is importable (``bash tools/setup.sh --vllm`` builds ``.venv-vllm``).
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (tools/setup.sh --vllm)")

from test_vllm_rollout import TEXTS, assert_matches_hf, prompts  # noqa: E402

from siirl.data_coordinator.fields import ROLLOUT_LOG_PROBS  # noqa: E402
from siirl.engine.fsdp.engines import fsdp_actor  # noqa: E402
from siirl.engine.rollout import vllm_server  # noqa: E402
from siirl.engine.rollout.vllm_rollout import VLLMRollout  # noqa: E402
from siirl.engine.rollout.vllm_server import (  # noqa: E402
    MARKER_ENV,
    ServerEngine,
    VLLMServerError,
)
from siirl.params.parser import parse_config  # noqa: E402

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[3]


def server_pids(log_path) -> list:
    """Processes started for the server that logs to ``log_path`` (its engine included)."""
    marker = f"{MARKER_ENV}={log_path}".encode() + b"\0"
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "environ").read_bytes() + b"\0":
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def run_config(run_dir, *overrides):
    return parse_config([
        "actor_rollout_ref.model.path=builtin:tiny-arith-hd32", "trainer.device=cpu",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=server",
        "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.max_num_seqs=16", f"trainer.default_local_dir={run_dir}",
        "data.max_response_length=6", "data.max_prompt_length=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.optim.lr=0.01", "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.entropy_coeff=0", *overrides])


def sync(actor, rollout):
    return rollout.load_weights(actor.export_weights(1 << 16))  # several buckets


def test_grpo_runs_four_steps_against_a_vllm_server(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "siirl.main_dag", "--config", str(ROOT / "configs/grpo_vllm.yaml"),
         "actor_rollout_ref.rollout.mode=server", "trainer.total_training_steps=4",
         f"trainer.default_local_dir={tmp_path}", "trainer.val_before_train=false",
         "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[]"],
        capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text()
               .splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4], records
    assert all("timing_s/weight_sync" in r and r["weight_sync/bytes"] > 0 for r in records)
    log = tmp_path / "vllm_server_rank0.log"
    assert log.exists()
    assert server_pids(log) == []  # stopped with the run


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("served")
    config = run_config(run_dir)
    actor = fsdp_actor(config)
    rollout = VLLMRollout(config=config, peers={"actor": actor})
    file_bytes, vllm_server.FILE_BYTES = vllm_server.FILE_BYTES, 1 << 16  # several files
    yield config, actor, rollout
    vllm_server.FILE_BYTES = file_bytes
    rollout.close()
    assert server_pids(rollout.llm.server.log_path) == []


def test_server_greedy_responses_and_log_probs_match_after_syncs(served):
    config, actor, rollout = served
    assert isinstance(rollout.llm, ServerEngine) and rollout.llm.server.alive()
    with pytest.raises(RuntimeError, match="weight sync must run"):
        rollout.generate(prompts(actor.tokenizer, TEXTS[:1]))
    moved = sync(actor, rollout)
    assert moved == sum(t.numel() * t.element_size() for t in actor.module.state_dict().values())
    before = assert_matches_hf(config, actor, rollout)
    batch = rollout.generate(prompts(actor.tokenizer, TEXTS[:2])).batch  # sampled, n=2
    assert batch.batch_size[0] == 4 and batch["uid"] is not None
    batch = actor.compute_log_prob(batch).batch
    batch.set("advantages", batch["response_mask"] * torch.tensor([1.0, -1, -1, 1])[:, None])
    actor.update_policy(batch)
    sync(actor, rollout)
    after = assert_matches_hf(config, actor, rollout)
    assert not torch.allclose(before[ROLLOUT_LOG_PROBS], after[ROLLOUT_LOG_PROBS])


def test_crashed_server_restarts_once_with_the_latest_weights(served):
    config, actor, rollout = served
    if rollout.needs_weights:
        sync(actor, rollout)
    batch = prompts(actor.tokenizer, TEXTS)
    want = rollout.generate(batch.clone(), validate=True).batch["responses"]
    first = rollout.llm.server.proc.pid
    os.killpg(first, signal.SIGKILL)
    rollout.llm.server.proc.wait()
    got = rollout.generate(batch.clone(), validate=True).batch["responses"]
    assert rollout.llm.server.proc.pid != first
    assert torch.equal(got, want)  # the restarted server got the last synced weights back
    os.killpg(rollout.llm.server.proc.pid, signal.SIGKILL)
    rollout.llm.server.proc.wait()
    with pytest.raises(VLLMServerError, match="crashed again"):
        rollout.generate(batch.clone(), validate=True)


@pytest.mark.parametrize("override, message", [
    ("+actor_rollout_ref.rollout.engine_kwargs.vllm.no_such_flag=1",
     r"exited with code \d+ while starting .*--no-such-flag"),
    ("actor_rollout_ref.rollout.server_timeout_s=1",
     r"did not answer /health within actor_rollout_ref.rollout.server_timeout_s=1 s"),
])
def test_server_that_cannot_start_fails_with_its_log_tail(tmp_path, override, message):
    config = run_config(tmp_path, override)
    with pytest.raises(VLLMServerError, match=message):
        VLLMRollout(config=config)
    log = tmp_path / "vllm_server_rank0.log"
    assert log.exists() and server_pids(log) == []
