"""Multi-turn tool calling in the plain RLVR pipelines: the tool-call parser, the tools
(the python sandbox's limits included), the tool loop's loss mask, the ``multi_turn``
rollout wrapper's batch, and a short GRPO run with multi-turn on."""

import contextlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import torch
from test_trajectory_manager import char_tokenizer

from siirl.dag_worker.data_structures import NodeOutput
from siirl.data_coordinator import protocol
from siirl.environment.multi_turn import MultiTurnRollout, ToolLoop
from siirl.environment.multi_turn.interactions import load_interactions
from siirl.environment.tools import (
    CalculatorTool,
    PythonTool,
    ToolCall,
    ToolSet,
    load_tools,
    parse_tool_calls,
    run_python,
    truncate,
)
from siirl.environment.tools.sandbox_fusion import run_remote
from siirl.errors import ConfigError

CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
PY = '<tool_call>{"name": "python", "arguments": {"code": "print(2**5)"}}</tool_call>'
TOOL_YAML = """tools:
  - class_name: calculator
    config: {}
    tool_schema:
      type: function
      function:
        name: calculator
        description: Evaluate arithmetic.
        parameters: {type: object, properties: {expression: {type: string}},
                     required: [expression]}
  - class_name: python
    config: {timeout_s: 5, memory_limit_mb: 512}
    tool_schema:
      type: function
      function:
        name: python
        description: Run Python.
        parameters: {type: object, properties: {code: {type: string}}, required: [code]}
"""


# -- parsing --------------------------------------------------------------------------------
def test_hermes_tool_calls_are_parsed_and_bad_ones_become_errors():
    text = (f"think {CALC} and "
            '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"1\\"}"}</tool_call>'
            "<tool_call>{not json}</tool_call><tool_call>[1]</tool_call>")
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls[:2]] == [
        ("calculator", {"expression": "6*7"}), ("python", {"code": "1"})]
    assert calls[2].error and "not valid JSON" in calls[2].error
    assert calls[3].error and "name" in calls[3].error
    assert parse_tool_calls("no calls here <answer>3</answer>") == []
    with pytest.raises(ConfigError, match="hermes"):
        parse_tool_calls(CALC, "pythonic")


def test_truncation_keeps_the_chosen_side():
    assert truncate("abcdefghij", 4, "left") == ("abcd...(truncated)", True)
    assert truncate("abcdefghij", 4, "right") == ("(truncated)...ghij", True)
    assert truncate("abcdefghij", 4, "middle") == ("ab...(truncated)...ij", True)
    assert truncate("abc", 4) == ("abc", False)


# -- tools ----------------------------------------------------------------------------------
def test_a_failing_tool_answers_with_its_error_text():
    tools = ToolSet([CalculatorTool(), PythonTool()])
    assert tools.call(ToolCall("calculator", {"expression": "6*7"})) == "42"
    assert tools.call(ToolCall("calculator", {"expression": "1/0"})).startswith(
        "error: ValueError: division by zero")
    assert "no tool named 'search'" in tools.call(ToolCall("search", {"q": "x"}))
    assert "needs a string argument" in tools.call(ToolCall("python", {"a": 1, "b": 2}))
    assert tools.call(ToolCall("", error="bad JSON")) == "error: bad JSON"
    assert "ValueError: bad" in tools.call(ToolCall("python", {"code": "raise ValueError('bad')"}))


def test_the_sandbox_stops_endless_loops_and_memory_bombs():
    looped = run_python("while True: pass", timeout_s=1, memory_mb=512)
    assert looped.timed_out and "time limit" in looped.text()
    bomb = run_python("x = bytearray(8 << 30)", timeout_s=5, memory_mb=256)
    assert "MemoryError" in bomb.stderr


def test_the_sandbox_truncates_output_and_refuses_sockets():
    loud = run_python("print('x' * 10**7)", timeout_s=5, max_output_chars=100)
    assert loud.truncated and len(loud.stdout) <= 100
    net = run_python("import socket\ntry:\n    socket.socket()\nexcept OSError as e:\n"
                     "    print('refused', e)\n", timeout_s=5)
    assert net.stdout.startswith("refused"), net.text()


def test_the_sandbox_works_in_a_temporary_folder_that_is_removed():
    result = run_python("import os\nopen('note.txt', 'w').write('hi')\nprint(os.getcwd())",
                        timeout_s=5)
    folder = result.stdout.strip()
    assert "siirl-sandbox-" in folder and folder != os.getcwd()
    assert not os.path.exists(folder)  # gone with everything written there


class _FakeSandboxFusion(BaseHTTPRequestHandler):
    requests: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append(body)
        answer = {"status": "Success", "message": "", "compile_result": None,
                  "run_result": {"status": "Finished", "stdout": f"ran {len(body['code'])}\n",
                                 "stderr": "", "return_code": 0, "execution_time": 0.01}}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def fake_sandbox_fusion():
    server = HTTPServer(("127.0.0.1", 0), _FakeSandboxFusion)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/run_code"
    finally:
        server.shutdown()


def test_sandbox_fusion_url_sends_the_code_to_the_service(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(TOOL_YAML)
    with fake_sandbox_fusion() as url:
        tools = load_tools(str(path), {"url": url, "max_concurrent": 2,
                                       "memory_limit_mb": 300})
        assert tools.call(ToolCall("python", {"code": "print(1)"})) == "ran 8\n"
        sent = _FakeSandboxFusion.requests[-1]
        assert sent["language"] == "python" and sent["code"] == "print(1)"
        assert sent["memory_limit_MB"] == 512 and sent["run_timeout"] == 5.0  # tool config wins
    down = run_remote(url, "print(1)", timeout_s=1)  # the server is gone: error text
    assert "sandbox service error" in down.text()


# -- the tool loop and the rollout wrapper ----------------------------------------------------
SCRIPT = [CALC, PY, "<answer>42</answer>"]


def encoded(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]


@pytest.mark.parametrize("chat", [False, True])
def test_tool_tokens_are_masked_out_of_a_two_tool_conversation(chat):
    tokenizer = char_tokenizer(chat)
    loop = ToolLoop(tokenizer, ToolSet([CalculatorTool(), PythonTool()]), budget=2000)
    conversation = loop.start(tokenizer.encode("What is 6*7?", add_special_tokens=False))
    turn = iter(SCRIPT)
    loop.run([conversation], lambda prompts, room: [encoded(tokenizer, next(turn))])
    assert conversation.done and conversation.assistant_turns == 3
    assert conversation.tool_calls == 2 and conversation.tool_errors == 0
    response, mask = conversation.response_ids, conversation.mask
    agent = [t for t, m in zip(response, mask, strict=True) if m]
    assert agent == [t for text in SCRIPT for t in encoded(tokenizer, text)]  # exactly
    tool = tokenizer.decode([t for t, m in zip(response, mask, strict=True) if not m])
    assert "42" in tool and "32" in tool
    assert ("<tool>" in tool) if chat else ("<tool_response>" in tool)


def test_turn_limits_and_the_budget_end_a_conversation():
    tokenizer = char_tokenizer(True)
    loop = ToolLoop(tokenizer, ToolSet([CalculatorTool()]), budget=2000,
                    max_assistant_turns=2)
    conversation = loop.start([5, 6])
    loop.run([conversation], lambda prompts, room: [encoded(tokenizer, CALC)])
    assert conversation.assistant_turns == 2 and conversation.tool_calls == 1
    small = ToolLoop(tokenizer, ToolSet([CalculatorTool()]), budget=len(CALC) + 5)
    conversation = small.start([5, 6])
    small.run([conversation], lambda prompts, room: [encoded(tokenizer, CALC)[:room]])
    assert len(conversation.response_ids) <= len(CALC) + 5 and conversation.done


class AskTwice:
    """A simulated user (verl's interaction methods, async like verl's): asks for a recheck
    once, then ends with a score."""

    def __init__(self, config):
        self.turns = {}

    async def start_interaction(self, instance_id, **kwargs):
        self.turns[instance_id] = 0

    async def generate_response(self, instance_id, messages):
        self.turns[instance_id] += 1
        done = self.turns[instance_id] >= 2
        return done, "" if done else "Are you sure?", 1.0 if done else 0.0, {}


def test_an_interaction_answers_final_replies_until_it_ends(tmp_path):
    path = tmp_path / "interaction.yaml"
    path.write_text("interaction:\n  - name: asker\n    class_name: test_multi_turn.AskTwice\n"
                    "    config: {}\n")
    tokenizer = char_tokenizer(True)
    loop = ToolLoop(tokenizer, ToolSet([]), budget=2000, max_user_turns=5)
    session = load_interactions(str(path)).session({"interaction_kwargs": {"name": "asker"}})
    conversation = loop.start([5, 6], [{"role": "user", "content": "2+2?"}], session)
    loop.run([conversation], lambda prompts, room: [encoded(tokenizer, "4")])
    assert conversation.assistant_turns == 2 and conversation.user_turns == 2
    assert conversation.turn_scores == [0.0, 1.0]
    user = tokenizer.decode([t for t, m in zip(conversation.response_ids, conversation.mask,
                                               strict=True) if not m])
    assert "Are you sure?" in user


class ScriptedEngine:
    """A rollout engine replying from a script per conversation (keyed by sample_id)."""

    def __init__(self, tokenizer, n=2, budget=1500):
        self.tokenizer, self.n, self.budget = tokenizer, n, budget
        self.calls = {}
        self.weights_loaded = 0

    @contextlib.contextmanager
    def overridden(self, n=None, response_length=None):
        yield

    def sampling(self, validate):
        return {"n": self.n}

    def max_response_length(self):
        return self.budget

    def load_weights(self, buckets):
        self.weights_loaded += 1
        return 0

    def generate(self, batch, validate=False):
        replies = []
        for key in batch["sample_id"].tolist():
            turn = self.calls.get(key, 0)
            self.calls[key] = turn + 1
            replies.append(encoded(self.tokenizer, SCRIPT[turn] if key % 2 == 0 else "no tools"))
        width = max(len(r) for r in replies)
        responses = torch.zeros((len(replies), width), dtype=torch.long)
        mask = torch.zeros((len(replies), width))
        for row, reply in enumerate(replies):
            responses[row, :len(reply)] = torch.tensor(reply)
            mask[row, :len(reply)] = 1
        return NodeOutput(batch=protocol.make_batch({"responses": responses,
                                                     "response_mask": mask}))


def test_the_wrapper_returns_a_plain_rollout_batch(tmp_path):
    tokenizer = char_tokenizer(True)
    path = tmp_path / "tools.yaml"
    path.write_text(TOOL_YAML)
    config = {"actor_rollout_ref": {"rollout": {"multi_turn": {
        "enable": True, "tool_config_path": str(path), "max_tool_response_length": 64}}}}
    inner = ScriptedEngine(tokenizer)
    rollout = MultiTurnRollout(config=config, peers={"rollout": inner}, tokenizer=tokenizer)
    prompts = [encoded(tokenizer, "What is 6*7?"), encoded(tokenizer, "Hi")]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    batch = protocol.make_batch({"input_ids": ids, "attention_mask": (ids != 0).long(),
                                 "sample_id": torch.tensor([0, 1])})
    protocol.set_non_tensor(batch, "raw_prompt", [[{"role": "user", "content": "What is 6*7?"}],
                                                  [{"role": "user", "content": "Hi"}]])
    protocol.set_non_tensor(batch, "ground_truth", ["42", "0"])
    out = rollout.generate(batch)
    assert out.batch.batch_size[0] == 4
    assert protocol.get_non_tensor(out.batch, "uid") == ["0", "0", "1", "1"]
    assert protocol.get_non_tensor(out.batch, "ground_truth") == ["42", "42", "0", "0"]
    rows = out.batch
    assert rows["responses"].shape == rows["response_mask"].shape == (4, 1500)
    prompt_width = rows["prompts"].shape[1]
    assert rows["input_ids"].shape[1] == prompt_width + 1500
    assert torch.equal(rows["input_ids"][:, prompt_width:], rows["responses"])
    tool_tokens = (rows["response_mask"] == 0) & (rows["attention_mask"][:, prompt_width:] == 1)
    # sample_ids 0*2+0 and 1*2+0 are even: those two conversations call both tools
    assert tool_tokens[[0, 2]].any(dim=1).all() and not tool_tokens[[1, 3]].any()
    assert out.metrics["multi_turn/tool_calls/mean"] == 1.0
    rollout.load_weights([])  # everything else is the wrapped engine's
    assert inner.weights_loaded == 1


# -- a short GRPO run ------------------------------------------------------------------------
def test_a_grpo_run_with_multi_turn_on_completes(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(TOOL_YAML)
    cmd = [sys.executable, "-m", "siirl.main_dag", f"trainer.default_local_dir={tmp_path}",
           "actor_rollout_ref.rollout.multi_turn.enable=true",
           f"actor_rollout_ref.rollout.multi_turn.tool_config_path={path}",
           "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
           "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
           "actor_rollout_ref.actor.ppo_mini_batch_size=4", "data.max_response_length=16",
           "trainer.total_training_steps=2", "trainer.val_before_train=true",
           "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[]"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, RAY_AUTH_MODE="disabled"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "val/score/mean" not in r]
    assert [r["step"] for r in train] == [1, 2]  # validation went through the wrapper too
    assert any("val/score/mean" in r for r in records)
    assert all("multi_turn/tool_calls/mean" in r and "actor/pg_loss" in r for r in train)
