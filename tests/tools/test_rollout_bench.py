"""tools/bench/rollout.py times the vllm rollout node against standalone vLLM and the hf
rollout node: its token counting and ratios here, plus one run where vLLM is importable
(figures only; speed is never asserted in tests)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "tools/bench"
sys.path.insert(0, str(BENCH))  # the script imports bench_info as a sibling
_spec = importlib.util.spec_from_file_location("rollout_bench", BENCH / "rollout.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_valid_count_stops_at_and_includes_the_first_eos():
    assert bench.valid_count([5, 6, 2, 7], [2], 8) == 3
    assert bench.valid_count([2], [2], 8) == 1
    assert bench.valid_count([5, 6, 7], [2, 3], 8) == 3  # no EOS: every token
    assert bench.valid_count([5, 6, 7, 8, 2], [2], 3) == 3  # cut at the width
    assert bench.valid_count((), [2], 8) == 0


def one_round(seconds, tokens):
    def named(values):  # (standalone, node, hf): the seed-per-call node as the node
        standalone, node, hf = values
        return dict(zip(bench.METHODS, (standalone, node, node, hf), strict=True))

    return {"seconds": named(seconds), "cpu_seconds": named(seconds), "tokens": named(tokens)}


def test_summary_skips_the_warmup_and_takes_medians_of_per_round_ratios():
    rounds = [one_round((9.0, 9.0, 9.0), (1, 1, 1)),  # warm-up: ignored
              one_round((1.0, 2.0, 1.0), (100, 100, 100)),
              one_round((1.0, 1.0, 4.0), (100, 90, 100)),
              one_round((2.0, 2.0, 1.0), (100, 100, 100))]
    summary = bench.summarize(rounds)
    assert summary["rounds_measured"] == 3
    standalone, node, _, hf = (summary["methods"][name] for name in bench.METHODS)
    assert standalone["median_s"] == 1.0 and node["median_s"] == 2.0 and hf["median_s"] == 1.0
    assert standalone["tokens_per_s"] == 100.0  # median of 100, 100, 50 tokens/s
    assert node["tokens_per_s"] == 50.0 and node["median_tokens"] == 100
    ratios = summary["ratios"]
    assert ratios["vllm node / standalone vllm"] == pytest.approx(0.9)  # 0.5, 0.9, 1.0
    assert ratios["vllm node / hf node"] == pytest.approx(0.5)  # 0.5, 3.6, 0.5


def test_summary_of_a_single_round_uses_it():
    summary = bench.summarize([one_round((1.0, 2.0, 4.0), (10, 10, 10))])
    assert summary["rounds_measured"] == 1
    assert summary["ratios"]["vllm node / hf node"] == pytest.approx(2.0)


@pytest.mark.vllm
def test_rollout_bench_runs_every_method(tmp_path, capsys):
    pytest.importorskip("vllm", reason="vLLM is not installed (tools/setup.sh --vllm)")
    out = tmp_path / "rollout.json"
    assert bench.main(["--rounds", "2", "--prompts", "4", "--out", str(out),
                       "actor_rollout_ref.rollout.n=2", "data.max_response_length=4"]) == 0
    result = json.loads(out.read_text())
    assert (result["prompts"], result["n"], result["new_tokens"]) == (4, 2, 4)
    assert result["model"] == "builtin:tiny-arith-hd32" and result["rounds_measured"] == 1
    assert set(result["methods"]) == set(bench.METHODS)
    for row in result["methods"].values():
        assert row["median_s"] > 0 and 0 < row["median_tokens"] <= 4 * 2 * 4
    assert all(value > 0 for value in result["ratios"].values())
    assert "vllm node / standalone vllm" in capsys.readouterr().out
