"""The ``sglang`` rollout (server mode) and its SGLang client.

Most of these run everywhere, against ``fake_sglang_server.py``: a small HTTP server that
answers SGLang's native endpoints with the request and response shapes read from SGLang's
source (the version is in ``siirl.engine.rollout.sglang_server``'s docstring). They check
our client against SGLang's documented protocol, not SGLang itself: the bodies sent (sampling
keys SGLang accepts, a seed per sample, stop ids, the explicit load format), the parsing of
samples and log-probs, the weight directory written (config.json and safetensors the fake
reads back and compares with the trainer's tensors), sleep/wake, and the one restart after a
crash, through the same process handling as the real server. The last test starts a real
SGLang server and runs only where ``sglang`` is importable and CUDA present
(``tools/gpu/sglang_check.sh``).
"""

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from siirl.data_coordinator.fields import ROLLOUT_LOG_PROBS
from siirl.data_coordinator.protocol import make_batch
from siirl.engine.fsdp.engines import fsdp_actor
from siirl.engine.rollout import sglang_rollout, vllm_engine
from siirl.engine.rollout.sglang_rollout import SGLangRollout, launch_args
from siirl.engine.rollout.sglang_server import (
    SGLangEngine,
    SGLangServer,
    SGLangServerError,
    parse_sample,
)
from siirl.errors import ConfigError, PluginNotFoundError
from siirl.params.parser import parse_config
from siirl.plugins import load_plugin

FAKE = Path(__file__).with_name("fake_sglang_server.py")
TEXTS = ["13+5=", "2+2=", "20-7="]
SAMPLING_KEYS = {"max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids",
                 "ignore_eos"}


def run_config(*overrides, model="builtin:tiny-arith", device="cpu"):
    return parse_config([
        f"actor_rollout_ref.model.path={model}", f"trainer.device={device}",
        "actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.mode=server",
        "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.n=2",
        "data.max_response_length=6", "data.max_prompt_length=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", *overrides])


def prompts(tokenizer, texts):
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return make_batch({"input_ids": ids, "attention_mask": mask,
                       "position_ids": (mask.cumsum(1) - 1).clamp(min=0),
                       "sample_id": torch.arange(len(rows))}), rows


class FakeServer(SGLangServer):
    """The SGLang server's process handling, with the fake in place of sglang."""

    def __init__(self, args, timeout_s, log_path, record):
        super().__init__(args, timeout_s, log_path)
        self.record = Path(record)

    def command(self):
        return [sys.executable, str(FAKE), *self.args, "--host", "127.0.0.1",
                "--port", str(self.port), "--record", str(self.record)]

    def entries(self, key=None):
        lines = [json.loads(x) for x in self.record.read_text().splitlines()]
        return [x for x in lines if key is None or key in x]

    def requests(self, path):
        return [x["body"] for x in self.entries("path") if x["path"] == path]

    def exchanges(self, path):
        return [x for x in self.entries("path") if x["path"] == path]


def fake_engine(cfg, tmp, free_cache=False, timeout_s=60.0):
    model_dir = vllm_engine.model_directory(cfg.actor_rollout_ref.model.path)
    hf_config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    args = launch_args(cfg, hf_config, model_dir, free_cache)
    server = FakeServer(args, timeout_s, Path(tmp) / "sglang_server_rank0.log",
                        Path(tmp) / "record.jsonl")
    return SGLangEngine(args, timeout_s, server.log_path, model_dir, server=server)


def digests(module):
    import hashlib

    return {name: hashlib.sha256(t.detach().contiguous().view(-1).view(torch.uint8).numpy()
                                 .tobytes()).hexdigest()
            for name, t in module.state_dict().items()}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fake_sglang")
    cfg = run_config()
    actor = fsdp_actor(cfg)
    rollout = SGLangRollout(config=cfg, peers={"actor": actor}, llm=fake_engine(cfg, tmp))
    yield cfg, actor, rollout
    rollout.close()
    assert not rollout.llm.server.alive()


# -- start-up: settings, command line, install -------------------------------------------
def test_the_rollout_is_the_sglang_entry_point():
    assert load_plugin("siirl.rollouts", "sglang") is SGLangRollout


def test_sglang_runs_as_a_server_only():
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.rollout\.mode='sync'.*server"):
        SGLangRollout(config=run_config("actor_rollout_ref.rollout.mode=sync"))


def test_cpu_workers_and_a_missing_sglang_are_refused_clearly():
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        SGLangRollout(config=run_config())
    try:
        import sglang  # noqa: F401
    except ImportError:
        with pytest.raises(PluginNotFoundError, match=r'pip install "siirl-engine\[sglang\]"'):
            sglang_rollout.import_sglang()


def test_launch_flags_follow_the_rollout_keys():
    cfg = run_config("actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=fa3",
                     "+actor_rollout_ref.rollout.engine_kwargs.sglang.enable_deterministic_"
                     "inference=true", "actor_rollout_ref.rollout.enable_chunked_prefill=false",
                     "trainer.seed=7")
    model_dir = vllm_engine.model_directory("builtin:tiny-arith")
    args = launch_args(cfg, AutoConfig.from_pretrained(model_dir), model_dir, free_cache=True)

    def value(flag):
        return args[args.index(flag) + 1]

    assert value("--model-path") == model_dir and "--skip-tokenizer-init" in args
    assert (value("--dtype"), value("--load-format"), value("--tp-size")) == (
        "float32", "dummy", "1")
    assert value("--mem-fraction-static") == "0.5" and value("--random-seed") == "7"
    assert value("--context-length") == str(16 + 6) and value("--chunked-prefill-size") == "-1"
    assert value("--max-running-requests") == "1024"
    assert {"--disable-cuda-graph", "--enable-memory-saver",
            "--enable-weights-cpu-backup"} <= set(args)
    assert value("--attention-backend") == "fa3"
    assert "--enable-deterministic-inference" in args  # true: a bare flag
    assert "--host" not in args and "--port" not in args  # the server's own


# -- the protocol, against the fake ------------------------------------------------------
def test_weight_sync_writes_a_model_directory_the_server_loads(served):
    cfg, actor, rollout = served
    with pytest.raises(RuntimeError, match="sglang rollout still holds dummy weights"):
        rollout.generate(prompts(actor.tokenizer, TEXTS[:1])[0])
    moved = rollout.load_weights(actor.export_weights(1 << 12))  # several buckets
    assert moved == sum(t.numel() * t.element_size() for t in actor.module.state_dict().values())
    server = rollout.llm.server
    body = server.requests("/update_weights_from_disk")[-1]
    assert body == {"model_path": body["model_path"], "load_format": "safetensors"}
    loaded = server.entries("loaded")[-1]
    assert loaded["loaded"] == digests(actor.module)  # every tensor, bit for bit
    assert {"config.json", "generation_config.json"} <= set(loaded["files"])
    paths = [x["path"] for x in server.entries("path")]
    assert paths[-2:] == ["/update_weights_from_disk", "/flush_cache"]


def test_sampled_requests_seed_every_sample_and_fill_the_batch(served):
    cfg, actor, rollout = served
    if rollout.needs_weights:
        rollout.load_weights(actor.export_weights(1 << 20))
    batch, rows = prompts(actor.tokenizer, TEXTS)
    eos_ids = rollout.stop_ids(actor.module, actor.tokenizer)[0]
    server = rollout.llm.server
    before = len(server.requests("/generate"))
    out = rollout.generate(batch).batch  # sampled, n=2
    bodies = server.requests("/generate")[before:]
    assert sorted(b["input_ids"][0] for b in bodies) == sorted(rows)
    seeds = []
    for body in bodies:
        assert body["return_logprob"] is True and body["input_ids"] == [body["input_ids"][0]] * 2
        for params in body["sampling_params"]:
            assert set(params) == SAMPLING_KEYS | {"sampling_seed"}
            assert params["top_k"] == -1 and params["temperature"] == 1.0
            assert params["max_new_tokens"] == 6 and params["ignore_eos"] is False
            assert params["stop_token_ids"] == eos_ids
            assert 0 <= params["sampling_seed"] < 2 ** 31
            seeds.append(params["sampling_seed"])
    assert len(set(seeds)) == len(seeds) == 2 * len(TEXTS)  # no two samples share a seed
    by_prompt = {tuple(x["body"]["input_ids"][0]): x["reply"]
                 for x in server.exchanges("/generate")[before:]}
    mask = out["response_mask"]
    for row, prompt in enumerate(rows):  # the batch keeps the prompts' order, n rows each
        for k, reply in enumerate(by_prompt[tuple(prompt)]):
            got, width = out["responses"][2 * row + k], int(mask[2 * row + k].sum())
            assert got[:width].tolist() == reply["output_ids"][:width]
            want = [e[0] for e in reply["meta_info"]["output_token_logprobs"]][:width]
            assert torch.allclose(out[ROLLOUT_LOG_PROBS][2 * row + k][:width],
                                  torch.tensor(want))
    assert (out[ROLLOUT_LOG_PROBS] * (1 - mask)).abs().max() == 0


def test_greedy_requests_carry_no_seed(served):
    cfg, actor, rollout = served
    if rollout.needs_weights:
        rollout.load_weights(actor.export_weights(1 << 20))
    server = rollout.llm.server
    before = len(server.requests("/generate"))
    rollout.generate(prompts(actor.tokenizer, TEXTS)[0], validate=True)  # val_kwargs: greedy
    for body in server.requests("/generate")[before:]:
        assert len(body["sampling_params"]) == 1  # val_kwargs.n=1
        assert body["sampling_params"][0]["temperature"] == 0.0
        assert set(body["sampling_params"][0]) == SAMPLING_KEYS


def test_sleep_and_wake_release_and_resume_memory_once(served):
    engine = served[2].llm
    server = engine.server
    engine.wake_up()  # not released: resuming would be an error in SGLang
    assert server.requests("/resume_memory_occupation") == []
    engine.sleep()
    engine.sleep()
    engine.wake_up()
    assert server.requests("/release_memory_occupation") == [{}]
    assert server.requests("/resume_memory_occupation") == [{}]


def test_refusals_and_aborts_are_errors_naming_the_server(served):
    engine = served[2].llm
    with pytest.raises(SGLangServerError, match="update_weights_from_disk with HTTP 400"):
        engine.reload_weights([])  # no tensors: the server has nothing to load
    with pytest.raises(SGLangServerError, match="aborted a request: too long"):
        parse_sample({"output_ids": [], "meta_info": {
            "finish_reason": {"type": "abort", "message": "too long"}}})
    with pytest.raises(SGLangServerError, match="other tokens"):
        parse_sample({"output_ids": [3], "meta_info": {"output_token_logprobs": [
            [-0.5, 4, None]]}})
    assert parse_sample({"output_ids": [3], "meta_info": {}}) == ([3], None)


def test_crashed_server_restarts_once_with_the_latest_weights(tmp_path):
    cfg = run_config()
    actor = fsdp_actor(cfg)
    rollout = SGLangRollout(config=cfg, peers={"actor": actor},
                            llm=fake_engine(cfg, tmp_path))
    try:
        rollout.load_weights(actor.export_weights(1 << 20))
        batch = prompts(actor.tokenizer, TEXTS)[0]
        want = rollout.generate(batch.clone(), validate=True).batch["responses"]
        server = rollout.llm.server
        first = server.proc.pid
        os.killpg(first, signal.SIGKILL)
        server.proc.wait()
        got = rollout.generate(batch.clone(), validate=True).batch["responses"]
        assert server.proc.pid != first
        assert torch.equal(got, want)  # the restarted server got the last synced weights
        assert len(server.entries("loaded")) == 2
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        with pytest.raises(SGLangServerError, match="crashed again"):
            rollout.generate(batch.clone(), validate=True)
    finally:
        rollout.close()


@pytest.mark.parametrize("env, timeout_s, message", [
    ("FAKE_SGLANG_EXIT", 60.0,
     r"SGLang server of the rollout exited with code 3 while starting .*fake failure"),
    ("FAKE_SGLANG_STARTING", 2.0,
     r"did not answer /health within actor_rollout_ref.rollout.server_timeout_s=2 s"),
])
def test_server_that_cannot_start_fails_with_its_log_tail(tmp_path, monkeypatch, env,
                                                          timeout_s, message):
    monkeypatch.setenv(env, "3")
    with pytest.raises(SGLangServerError, match=message):
        fake_engine(run_config(), tmp_path, timeout_s=timeout_s)
    assert (tmp_path / "sglang_server_rank0.log").exists()


# -- the real server (CUDA) --------------------------------------------------------------
@pytest.mark.sglang
def test_real_sglang_server_matches_hf_greedy_after_a_sync(tmp_path):
    pytest.importorskip("sglang", reason="sglang is not installed (CUDA-only)")
    if not torch.cuda.is_available():
        pytest.skip("SGLang needs a CUDA GPU")
    from siirl.engine.rollout.hf_rollout import HFRollout

    cfg = run_config("actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend="
                     "torch_native", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
                     f"trainer.default_local_dir={tmp_path}",
                     model="builtin:tiny-arith-hd32", device="cuda")
    actor = fsdp_actor(cfg)
    rollout = SGLangRollout(config=cfg, peers={"actor": actor})
    try:
        rollout.load_weights(actor.export_weights(1 << 20))
        batch = prompts(actor.tokenizer, TEXTS)[0]
        got = rollout.generate(batch.clone(), validate=True).batch
        want = HFRollout(config=cfg, peers={"actor": actor}).generate(
            batch.clone(), validate=True).batch
        assert torch.equal(got["responses"].cpu(), want["responses"].cpu())
        own = actor.compute_log_prob(got.clone()).batch["old_log_probs"].cpu()
        mask = got["response_mask"].cpu()
        assert (got[ROLLOUT_LOG_PROBS].cpu() - own * mask).abs().max() < 1e-2
        sampled = rollout.generate(prompts(actor.tokenizer, TEXTS)[0]).batch
        assert sampled["responses"].shape[0] == 2 * len(TEXTS)
    finally:
        rollout.close()
    assert not (tmp_path / "sglang_server_rank0.log").read_text().count("Traceback")
