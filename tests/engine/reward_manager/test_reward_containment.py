"""User reward code is contained under every manager: a fault costs only its sample.

Each manager (naive, dapo, parallel, batch) scores rows where one runs a fault (raise,
sys.exit, os._exit, SIGKILL, a segfault, a hang, NaN, inf, 1e300, "0.5", None): that
sample scores 0.0 and is counted under its kind, the others keep their scores, and the
worker process that died or hung is replaced for the next call.
"""

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from siirl.data_coordinator.protocol import get_non_tensor, make_batch
from siirl.engine.reward_manager import get_reward_manager_cls
from siirl.engine.reward_manager.failures import RewardFunctionError
from siirl.engine.reward_manager.outcome import KINDS, MAX_ABS_SCORE, Failure, check_result
from siirl.errors import ConfigError

REWARD_FILE = """
    import ctypes, os, signal, sys, time

    SPECIAL = {"nan": float("nan"), "inf": float("inf"), "huge": 1e300, "string": "0.5",
               "none": None}

    def value(text, truth):
        if text == "raise":
            raise ValueError("bad sample")
        if text == "sys_exit":
            sys.exit(0)
        if text == "os_exit":
            os._exit(0)
        if text == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if text == "segfault":
            ctypes.string_at(0)
        if text == "hang":
            time.sleep(3600)
        if text == "slow":
            time.sleep(0.4)
        return SPECIAL[text] if text in SPECIAL else float(text == truth)

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return value(solution_str, ground_truth)

    def batch_score(data_sources, solution_strs, ground_truths, extra_infos):
        return [value(s, g) for s, g in zip(solution_strs, ground_truths)]

    def short(data_sources, solution_strs, ground_truths, extra_infos):
        return [1.0] * (len(solution_strs) - 1)
"""
FAULT_KIND = {"raise": "exception", "sys_exit": "exit", "os_exit": "exit", "sigkill": "crash",
              "segfault": "crash", "hang": "timeout", "nan": "non_finite", "inf": "non_finite",
              "huge": "non_finite", "string": "non_numeric", "none": "non_numeric"}
MANAGERS = ("naive", "dapo", "parallel", "batch")


class CharTokenizer:
    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(chr(i) for i in row if i) for row in rows]


def reward_batch(texts, truths):
    width = max(map(len, texts))
    ids = torch.zeros(len(texts), width, dtype=torch.long)
    mask = torch.zeros(len(texts), width)
    for i, text in enumerate(texts):
        ids[i, :len(text)] = torch.tensor([ord(c) for c in text])
        mask[i, :len(text)] = 1.0
    return make_batch({"responses": ids, "response_mask": mask},
                      {"data_source": ["task"] * len(texts), "ground_truth": list(truths)})


@pytest.fixture(scope="module")
def reward_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "reward.py"
    path.write_text(textwrap.dedent(REWARD_FILE))
    return str(path)


def build(name, path, timeout_s=30.0, fn=None, **reward_model):
    config = {"reward_model": {"reward_manager": name, **reward_model},
              "custom_reward_function": {
                  "path": path, "name": fn or ("batch_score" if name == "batch" else
                                               "compute_score"),
                  "reward_kwargs": {"timeout_s": timeout_s}}}
    kwargs = {"num_workers": 2} if name == "parallel" else {}
    return get_reward_manager_cls(name)(config=config, tokenizer=CharTokenizer(), **kwargs)


@pytest.fixture(scope="module")
def managers(reward_path):
    """Per manager: one with a generous timeout, one with 1 s for the hang cases. Shared
    by the cases, so each also checks that a replaced worker serves the next call."""
    made = {name: (build(name, reward_path), build(name, reward_path, timeout_s=1.0))
            for name in MANAGERS}
    yield made
    for pair in made.values():
        for manager in pair:
            manager.close()


@pytest.mark.parametrize("fault", list(FAULT_KIND))
@pytest.mark.parametrize("name", MANAGERS)
def test_a_fault_costs_only_its_sample(managers, name, fault):
    manager = managers[name][fault == "hang"]
    texts = ["a", "b", fault, "c", "d"]
    out = manager.compute_reward(reward_batch(texts, ["a", "x", "?", "c", "d"]))
    # "b" is a plain wrong answer (0.0, no error); only the faulty sample is an error
    assert get_non_tensor(out.batch, "score") == [1.0, 0.0, 0.0, 1.0, 1.0]
    kind = FAULT_KIND[fault]
    m = out.metrics
    assert m["reward/errors"] == 1.0 and m["reward/samples"] == 5.0
    assert {k: m[f"reward/errors/{k}"] for k in KINDS} == {k: float(k == kind) for k in KINDS}
    if name == "batch" and kind not in ("non_finite", "non_numeric"):
        assert m["reward/retried"] > 0  # the call failed whole and was split


def test_every_kind_at_once_is_warned_about_once_with_an_example(reward_path, caplog):
    manager = build("naive", reward_path, timeout_s=1.0)
    faults = list(FAULT_KIND)
    texts = ["a", *faults, "c"]
    try:
        with caplog.at_level(logging.WARNING):
            out = manager.compute_reward(reward_batch(texts, ["a"] + ["?"] * len(faults) + ["c"]))
            again = manager.compute_reward(reward_batch(["raise", "a"], ["?", "a"]))
    finally:
        manager.close()
    scores = get_non_tensor(out.batch, "score")
    assert scores[0] == scores[-1] == 1.0 and not any(scores[1:-1])
    for kind in KINDS:
        expected = sum(FAULT_KIND[f] == kind for f in faults)
        assert out.metrics[f"reward/errors/{kind}"] == expected, kind
    assert out.metrics["reward/errors"] == len(faults)
    assert get_non_tensor(again.batch, "score") == [0.0, 1.0]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == len(KINDS)  # once per kind, not per sample or per call
    first = {kind: 1 + next(i for i, f in enumerate(faults) if FAULT_KIND[f] == kind)
             for kind in KINDS}
    for kind, sample in first.items():
        line = next(w for w in warnings if f"({kind})" in w)
        assert f"sample {sample} " in line and reward_path in line and "'compute_score'" in line
    text = "\n".join(warnings)
    for cause in ("ValueError: bad sample", "sys.exit(0)", "SIGKILL", "timeout_s=1 s", "nan",
                  "'0.5' (str)"):
        assert cause in text, cause


def test_the_step_budget_bounds_a_slow_function(reward_path):
    manager = build("naive", reward_path, step_timeout_s=1.0)
    try:
        start = time.monotonic()
        out = manager.compute_reward(reward_batch(["a"] + ["slow"] * 8, ["a"] + ["?"] * 8))
        elapsed = time.monotonic() - start
    finally:
        manager.close()
    assert elapsed < 6.0, elapsed  # not the 9 x 0.4 s the rows would take
    assert get_non_tensor(out.batch, "score")[0] == 1.0
    timeouts = out.metrics["reward/errors/timeout"]
    assert 1 <= timeouts <= 8 and out.metrics["reward/errors"] == timeouts


def test_batch_function_with_the_wrong_length_names_it(reward_path):
    manager = build("batch", reward_path, fn="short")
    try:
        with pytest.raises(ConfigError, match=r"'short' in .*reward\.py.*2 results for 3 rows"):
            manager.compute_reward(reward_batch(["a", "b", "c"], ["a", "b", "c"]))
    finally:
        manager.close()


def test_function_objects_run_in_process_and_are_contained():
    def exits(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "x":
            sys.exit(0)
        return float("nan") if solution_str == "n" else 1.0

    manager = get_reward_manager_cls("naive")(config={}, tokenizer=CharTokenizer(),
                                              compute_score=exits)
    out = manager.compute_reward(reward_batch(["a", "x", "n"], ["a", "a", "a"]))
    assert get_non_tensor(out.batch, "score") == [1.0, 0.0, 0.0]
    assert out.metrics["reward/errors/exit"] == 1 and out.metrics["reward/errors/non_finite"] == 1


def test_results_are_checked():
    from fractions import Fraction

    import numpy as np

    for good, value in ((True, 1.0), (3, 3.0), (np.float32(0.5), 0.5), (torch.tensor(2.0), 2.0),
                        (Fraction(1, 4), 0.25), ({"score": -MAX_ABS_SCORE, "acc": 1}, -1e9)):
        assert check_result(good).score == value
    assert check_result({"score": 1.0, "acc": True}).extras == {"acc": True}
    for bad, kind in (("0.5", "non_numeric"), (None, "non_numeric"), ([1.0], "non_numeric"),
                      ({"acc": 1}, "non_numeric"), (torch.ones(2), "non_numeric"),
                      (float("nan"), "non_finite"), (-float("inf"), "non_finite"),
                      (1e300, "non_finite"), (MAX_ABS_SCORE * 1.01, "non_finite"),
                      (np.float64("nan"), "non_finite")):
        result = check_result(bad)
        assert isinstance(result, Failure) and result.kind == kind, bad


def test_failed_steps_error_names_the_function_and_the_last_error(reward_path):
    manager = build("naive", reward_path)
    try:
        manager.compute_reward(reward_batch(["a", "sys_exit"], ["a", "?"]))
    finally:
        manager.close()
    error = manager.failed_steps_error(3)
    assert isinstance(error, RewardFunctionError) and error.exit_code == 1
    text = str(error)
    assert "'compute_score' in " + reward_path in text and "max_failed_steps=3" in text
    assert "sample 1" in text and "sys.exit(0)" in text and "\n" not in text


INTERRUPTED = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's foreground job
sys.path.insert(0, {here!r})
from test_reward_containment import build, reward_batch
manager = build({name!r}, {path!r})
open({marker!r}, "w").close()  # built: the Ctrl-C comes while scoring, not while starting
try:
    manager.compute_reward(reward_batch(["hang"] * 4, ["?"] * 4))
except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    sys.exit(130)
"""


@pytest.mark.parametrize("name", ["naive", "parallel"])
def test_ctrl_c_reaches_only_the_trainer_and_stops_the_workers(reward_path, name, tmp_path):
    marker = str(tmp_path / "built")
    script = INTERRUPTED.format(here=os.path.dirname(__file__), name=name, path=reward_path,
                                marker=marker)
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    workers = []
    while len(workers) < (2 if name == "parallel" else 1) or not os.path.exists(marker):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
        workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                 text=True).stdout.split()
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and err.strip() == "interrupted", err
    time.sleep(0.3)
    for pid in workers:
        assert not os.path.exists(f"/proc/{pid}") or \
            open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", pid


@pytest.mark.parametrize("top_level, cause", [("import sys\nsys.exit(0)", "SystemExit"),
                                              ("import time\ntime.sleep(3600)", "hang"),
                                              ("import not_a_module_xyz", "not_a_module")])
def test_a_reward_file_that_exits_hangs_or_fails_at_import_fails_at_build(
        tmp_path, monkeypatch, top_level, cause):
    from siirl.engine.reward_manager import _process

    monkeypatch.setattr(_process, "START_TIMEOUT_S", 2.0)
    path = tmp_path / "reward.py"
    path.write_text(top_level + "\ndef compute_score(**kwargs):\n    return 1.0\n")
    with pytest.raises(ConfigError, match=cause):
        build("naive", str(path))


def test_the_trainer_never_imports_the_reward_file(tmp_path):
    ran = tmp_path / "ran.py"  # records the pid of the process that imports it
    ran.write_text("import os\nopen(__file__ + '.pid', 'w').write(str(os.getpid()))\n"
                   "def compute_score(**kwargs):\n    return 1.0\n")
    manager = build("naive", str(ran))
    manager.close()
    assert int((tmp_path / "ran.py.pid").read_text()) != os.getpid()


def test_the_parallel_manager_takes_reward_model_num_workers():
    from siirl.engine.reward_manager.parallel import ParallelRewardManager

    manager = ParallelRewardManager(config={"reward_model": {"num_workers": 3}},
                                    tokenizer=object())
    assert manager.num_workers == 3
    assert ParallelRewardManager(config={}, tokenizer=object(), num_workers=2).num_workers == 2
    with pytest.raises(ConfigError, match="reward_model.num_workers=0"):
        ParallelRewardManager(config={"reward_model": {"num_workers": 0}}, tokenizer=object())
