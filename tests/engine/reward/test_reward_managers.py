"""naive and batch reward managers, custom function loading, the manager registry."""

import logging
import textwrap
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from reward_fakes import CharTokenizer, make_reward_batch

from siirl.data_coordinator.protocol import get_non_tensor
from siirl.engine.reward_manager import get_reward_manager_cls, load_custom_function
from siirl.engine.reward_manager.batch import BatchRewardManager
from siirl.engine.reward_manager.naive import NaiveRewardManager
from siirl.errors import ConfigError, DataError, PluginNotFoundError


def write_reward_file(tmp_path, body, name="my_reward.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_naive_scores_at_last_valid_token():
    batch = make_reward_batch(["68", "-5 ok", "12"], ["arithmetic"] * 3, ["68", "-5", "13"],
                              width=8)
    out = NaiveRewardManager(config={}, tokenizer=CharTokenizer()).compute_reward(batch)
    scores = out.batch["token_level_scores"]
    assert scores.dtype == torch.float32 and scores.shape == (3, 8)
    expected = torch.zeros(3, 8)
    expected[0, 1] = 1.0  # "68": last valid token at index 1
    expected[1, 4] = 1.0  # "-5 ok": index 4
    assert torch.equal(scores, expected)
    assert torch.equal(out.batch["token_level_rewards"], scores)
    assert out.batch["token_level_rewards"].data_ptr() != scores.data_ptr()
    assert get_non_tensor(out.batch, "score") == [1.0, 1.0, 0.0]
    assert get_non_tensor(out.batch, "acc") == [True, True, False]
    assert out.batch is batch  # fields are written into the batch handed in, no copy
    m = out.metrics
    assert m["critic/score/mean"] == pytest.approx(2 / 3)
    assert m["critic/score/max"] == 1.0 and m["critic/score/min"] == 0.0
    assert m["critic/rewards/mean"] == pytest.approx(2 / 3)
    assert m["reward/arithmetic/mean"] == pytest.approx(2 / 3)
    assert m["reward/errors"] == 0.0


def test_naive_mixed_sources_and_tokenizer_from_the_actor_peer():
    actor = SimpleNamespace(tokenizer=CharTokenizer())
    batch = make_reward_batch(["#### 72", "no", "\\boxed{4}"],
                              ["openai/gsm8k", "openai/gsm8k", "math"], ["72", "72", "4"])
    out = NaiveRewardManager(role="reward", config=OmegaConf.create({}),
                             peers={"actor": actor}).compute_reward(batch)
    assert get_non_tensor(out.batch, "score") == [1.0, 0.0, 1.0]
    assert out.metrics["reward/openai/gsm8k/mean"] == 0.5
    assert out.metrics["reward/math/mean"] == 1.0
    assert "acc" not in out.batch.keys()  # float scorers give no acc
    unknown = make_reward_batch(["1"], ["my/data"], ["1"])
    with pytest.raises(ConfigError, match="'my/data'.*custom_reward_function.path"):
        NaiveRewardManager(config={}, tokenizer=CharTokenizer()).compute_reward(unknown)


def test_reward_fn_key_and_verl_reward_model_field():
    from siirl.data_coordinator.protocol import make_batch

    batch = make_reward_batch(["7"], ["x"], ["7"])
    batch = make_batch({"responses": batch["responses"], "response_mask": batch["response_mask"]},
                       {"source": ["arithmetic"], "reward_model": [{"ground_truth": "7"}]})
    config = {"data": {"reward_fn_key": "source"}}
    out = NaiveRewardManager(config=config, tokenizer=CharTokenizer()).compute_reward(batch)
    assert get_non_tensor(out.batch, "score") == [1.0]
    with pytest.raises(DataError, match="data_source"):
        NaiveRewardManager(config={}, tokenizer=CharTokenizer()).compute_reward(batch)


def test_custom_function_with_kwargs_dict_result_and_errors(tmp_path, caplog):
    path = write_reward_file(tmp_path, """
        def score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
            if solution_str == "boom":
                raise RuntimeError("scorer exploded")
            if solution_str == "none":
                return None
            ok = solution_str == ground_truth
            return {"score": float(ok) + bonus, "acc": ok, "length": len(solution_str)}
    """)
    config = OmegaConf.create({"custom_reward_function": {
        "path": path, "name": "score", "reward_kwargs": {"bonus": 0.5, "timeout_s": 3}}})
    manager = NaiveRewardManager(config=config, tokenizer=CharTokenizer())
    assert manager.reward_kwargs == {"bonus": 0.5}  # timeout_s configures the manager only
    batch = make_reward_batch(["a", "boom", "none", "b"], ["mine"] * 4, ["a", "x", "x", "c"],
                              extra_infos=[{"i": 0}, {}, {}, {}])
    with caplog.at_level(logging.WARNING):
        out = manager.compute_reward(batch)
    assert get_non_tensor(out.batch, "score") == [1.5, 0.0, 0.0, 0.5]
    assert get_non_tensor(out.batch, "acc") == [True, False, False, False]
    assert get_non_tensor(out.batch, "length") == [1, 0, 0, 1]
    assert out.metrics["reward/errors"] == 2.0
    text = caplog.text
    assert "sample 1" in text and "'mine'" in text and "RuntimeError: scorer exploded" in text
    assert "sample 2" in text and "returned None" in text


def test_custom_function_loading_errors(tmp_path):
    with pytest.raises(ConfigError, match="missing.py.*compute_score"):
        load_custom_function(str(tmp_path / "missing.py"))
    path = write_reward_file(tmp_path, "def other(**kw):\n    return 1.0\n")
    with pytest.raises(ConfigError, match="my_reward.py' defines no function "
                                          "'compute_score'.*it defines other"):
        NaiveRewardManager(config={"custom_reward_function": {"path": path}},
                           tokenizer=CharTokenizer())
    broken = write_reward_file(tmp_path, "import not_a_module_xyz\n", name="broken.py")
    with pytest.raises(ConfigError, match="broken.py.*ModuleNotFoundError"):
        load_custom_function(broken, "compute_score")


def test_batch_manager_calls_once_on_lists(tmp_path):
    path = write_reward_file(tmp_path, """
        def batch_score(data_sources, solution_strs, ground_truths, extra_infos, scale=1.0):
            with open(__file__ + ".calls", "a") as calls:  # it runs in a worker process
                calls.write(f"{len(solution_strs)} ")
            return [scale * float(s == g) for s, g in zip(solution_strs, ground_truths)]
    """)
    config = {"reward_model": {"reward_manager": "batch"}, "custom_reward_function": {
        "path": path, "name": "batch_score", "reward_kwargs": {"scale": 2.0}}}
    manager = get_reward_manager_cls("batch")(role="reward", config=config, worker=None,
                                              tokenizer=CharTokenizer())
    batch = make_reward_batch(["a", "b", "c"], ["s"] * 3, ["a", "x", "c"])
    out = manager.compute_reward(batch)
    assert get_non_tensor(out.batch, "score") == [2.0, 0.0, 2.0]
    assert open(path + ".calls").read().split() == ["3"]
    assert out.batch["token_level_scores"][0, 0] == 2.0


def test_batch_manager_failures(tmp_path, caplog):
    path = write_reward_file(tmp_path, """
        def raises(data_sources, solution_strs, ground_truths, extra_infos):
            raise ValueError("verifier down")
        def short(data_sources, solution_strs, ground_truths, extra_infos):
            return [1.0]
    """)
    batch = make_reward_batch(["a", "b"], ["s"] * 2, ["a", "b"])

    def manager(name):
        return BatchRewardManager(config={"custom_reward_function": {"path": path, "name": name}},
                                  tokenizer=CharTokenizer())

    with caplog.at_level(logging.WARNING):
        out = manager("raises").compute_reward(batch)
    assert get_non_tensor(out.batch, "score") == [0.0, 0.0]
    assert out.metrics["reward/errors"] == 2.0
    # one warning for the failed call, one for the first sample that failed alone
    assert caplog.text.count("verifier down") == 2
    with pytest.raises(ConfigError, match="1 results for 2 rows"):
        manager("short").compute_reward(batch)
    # without a custom function the built-in rules apply row by row
    plain = BatchRewardManager(config={}, tokenizer=CharTokenizer())
    out = plain.compute_reward(make_reward_batch(["5"], ["arithmetic"], ["5"]))
    assert get_non_tensor(out.batch, "score") == [1.0]


def test_registry_and_missing_tokenizer():
    assert get_reward_manager_cls("naive") is NaiveRewardManager
    assert get_reward_manager_cls("parallel").__name__ == "ParallelRewardManager"
    with pytest.raises(PluginNotFoundError, match="no plugin named 'nope'.*naive"):
        get_reward_manager_cls("nope")
    batch = make_reward_batch(["5"], ["arithmetic"], ["5"])
    with pytest.raises(ConfigError, match="tokenizer"):
        NaiveRewardManager(config={}).compute_reward(batch)


def test_all_masked_row_and_empty_batch():
    batch = make_reward_batch(["5", "5"], ["arithmetic"] * 2, ["5", "5"], width=4)
    batch["response_mask"][1] = 0.0  # nothing valid: decodes to "" and scores 0
    out = NaiveRewardManager(config={}, tokenizer=CharTokenizer()).compute_reward(batch)
    assert get_non_tensor(out.batch, "score") == [1.0, 0.0]
    empty = NaiveRewardManager(config={}, tokenizer=CharTokenizer()).compute_reward(batch[0:0])
    assert empty.batch["token_level_scores"].shape == (0, 4)
    assert empty.metrics["reward/errors"] == 0.0 and empty.metrics["reward/samples"] == 0.0
    assert "critic/score/mean" not in empty.metrics


def test_decode_matches_per_row_masking_with_holes_and_empty_batches():
    class DecodeOnly:  # no batch_decode: the manager falls back to decode per row
        def decode(self, ids, skip_special_tokens=True):
            return CharTokenizer().decode(ids, skip_special_tokens)

    ids = torch.tensor([[ord(c) for c in "abcd"], [ord(c) for c in "wxyz"],
                        [ord(c) for c in "mnop"]])
    mask = torch.tensor([[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 1, 0]])
    expected = [CharTokenizer().decode(row[m > 0].tolist())
                for row, m in zip(ids, mask, strict=True)]
    assert expected == ["acd", "", "mno"]
    for tok in (CharTokenizer(), DecodeOnly()):
        manager = NaiveRewardManager(config={}, tokenizer=tok)
        assert manager.decode(ids, mask) == expected
        assert manager.decode(ids[:0], mask[:0]) == []
