"""siiRL's ``siirl.utils.reward_score.default_compute_score``: the built-in rule for a row's
data_source under siiRL's name and signature, also from a user's reward function that falls
back on it (run, as every user function, in a reward worker process)."""

import pytest
from reward_fakes import CharTokenizer, make_reward_batch

from siirl.data_coordinator.protocol import get_non_tensor
from siirl.engine.reward_manager.naive import NaiveRewardManager
from siirl.engine.reward_score import default_compute_score as builtin_rules
from siirl.errors import ConfigError
from siirl.utils.reward_score import default_compute_score

USER_FUNCTION = '''
from siirl.utils.reward_score import default_compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if data_source == "my/riddles":
        return 0.25 if ground_truth in solution_str else 0.0
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
'''


@pytest.mark.parametrize("source,solution,truth", [
    ("openai/gsm8k", "so #### 72", "72"), ("openai/gsm8k", "so #### 70", "72"),
    ("openai/gsm8k", "72", "72"),  # strict, as in siiRL: no "####", no score
    ("lighteval/MATH", "it is \\boxed{\\frac12}", "\\frac{1}{2}"),
    ("DigitalLearningGmbH/MATH-lighteval", "\\boxed{3}", "4"),
])
def test_it_is_the_built_in_rule_with_siirls_keywords(source, solution, truth):
    expected = builtin_rules(source, solution, truth, None)
    assert default_compute_score(source, solution, truth) == expected
    assert default_compute_score(source, solution, truth, {"split": "train"},
                                 sandbox_fusion_url=None, concurrent_semaphore=None) == expected
    assert expected in (0.0, 1.0)


def test_a_source_without_a_rule_is_named():
    with pytest.raises(ConfigError, match="'codecontests'.*custom_reward_function.path"):
        default_compute_score("codecontests", "print(1)", "{}")


def test_a_users_function_falls_back_on_it_in_the_worker_process(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(USER_FUNCTION)
    config = {"custom_reward_function": {"path": str(path), "name": "compute_score"}}
    manager = NaiveRewardManager(config=config, tokenizer=CharTokenizer())
    try:
        batch = make_reward_batch(["#### 68", "#### 5", "a sphinx"],
                                  ["openai/gsm8k", "openai/gsm8k", "my/riddles"],
                                  ["68", "6", "sphinx"])
        out = manager.compute_reward(batch)
    finally:
        manager.close()
    assert get_non_tensor(out.batch, "score") == [1.0, 0.0, 0.25]
