"""Built-in rule scorers and the example custom GSM8K reward."""

import pytest

from siirl.engine.reward_score import SCORERS, default_compute_score
from siirl.engine.reward_score.gsm8k import compute_score as gsm8k_score
from siirl.engine.reward_score.gsm8k import extract_solution
from siirl.engine.reward_score.math_answer import last_boxed, normalize_answer
from siirl.errors import ConfigError
from siirl.user_interface.rewards_interface.custom_gsm8k_reward import (
    compute_score as custom_gsm8k,
)


@pytest.mark.parametrize("response, truth, acc", [
    ("68", "68", True),
    (" 68 because 23+45", "68", True),
    ("The answer: 68.", "68", True),
    ("-12", "-12", True),
    ("12", "-12", False),
    ("67, no wait 68", "68", False),  # the first integer counts
    ("no digits", "68", False),
    ("68", 68, True),
])
def test_arithmetic(response, truth, acc):
    result = default_compute_score("arithmetic", response, truth)
    assert result == {"score": 1.0 if acc else 0.0, "acc": acc}


@pytest.mark.parametrize("text, strict, flexible", [
    ("so 3 + 4 = 7\n#### 72", "72", "72"),
    ("#### 1,234", "1234", "1234"),
    ("first #### 5 then #### 6", "6", "6"),  # last marker wins
    ("#### -3", "-3", "-3"),
    ("The answer is 72", None, "72"),
    ("It costs $1,000.", None, "1000"),  # commas and the final period dropped
    ("nothing here.", None, None),
])
def test_gsm8k_extraction(text, strict, flexible):
    assert extract_solution(text, "strict") == strict
    assert extract_solution(text, "flexible") == flexible


def test_gsm8k_scores():
    assert default_compute_score("openai/gsm8k", "work\n#### 72", "72") == 1.0
    assert default_compute_score("gsm8k", "work\n#### 71", "72") == 0.0  # format_score
    assert default_compute_score("openai/gsm8k", "The answer is 72", "72") == 0.0  # strict
    assert gsm8k_score("#### 71", "72", format_score=0.1) == pytest.approx(0.1)
    assert gsm8k_score("no answer", "72", format_score=0.1) == 0.0
    assert gsm8k_score("The answer is 72", "72", method="flexible") == 1.0
    assert gsm8k_score("#### 1,000", "1000") == 1.0
    assert gsm8k_score("#### -5", "-5") == 1.0
    # only the tail is searched, as in verl
    assert gsm8k_score("#### 72" + " filler" * 100, "72") == 0.0


def test_last_boxed():
    assert last_boxed(r"\boxed{1} then \boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert last_boxed(r"so \boxed{\{a, \{b\}\}} done") == r"\{a, \{b\}\}"
    assert last_boxed(r"x = \boxed{{a}^{2}}") == "{a}^{2}"
    assert last_boxed(r"\fbox{7}") == "7"
    assert last_boxed(r"$\boxed 5$") == "5"
    assert last_boxed(r"\boxed{unclosed") is None
    assert last_boxed("no box") is None


@pytest.mark.parametrize("a, b", [
    (r"\dfrac{1}{2}", r"\frac12"),
    (r"\left( 1, 2 \right)", "(1,2)"),
    (r"90^\circ", "90"),
    (r"90^{\circ}", "90"),
    (r"\$5", "5"),
    ("5.", "5"),
    (r"10\!000", "10000"),
    (r"5 \text{ cm}", "5"),
    ("x = 3", "3"),
    ("3/4", r"\frac{3}{4}"),
    (r"\sqrt2", r"\sqrt{2}"),
    (r"50\%", "50"),
    ("0.5", r"\frac{1}{2}"),
    (".5", "0.5"),
])
def test_normalize_answer_equal(a, b):
    assert normalize_answer(a) == normalize_answer(b)


def test_math_scores():
    for source in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "math",
                   "HuggingFaceH4/MATH-500"):
        assert default_compute_score(source, r"so \boxed{\dfrac{1}{2}}.", r"\frac{1}{2}") == 1.0
        assert default_compute_score(source, r"\boxed{\frac{1}{3}}", r"\frac{1}{2}") == 0.0
        assert default_compute_score(source, "1/2 without a box", r"\frac{1}{2}") == 0.0
    # a ground truth given as a full boxed solution is accepted too
    assert default_compute_score("math", r"\boxed{4}", r"... so \boxed{4}") == 1.0


def test_unknown_source_is_a_config_error():
    with pytest.raises(ConfigError) as err:
        default_compute_score("my/dataset", "1", "1")
    message = str(err.value)
    assert "my/dataset" in message and "custom_reward_function.path" in message
    assert all(name in message for name in SCORERS)


@pytest.mark.parametrize("text, truth, expected", [
    ("The answer is 72.", "72", {"score": 1.0, "acc": True}),
    ("so 1,200 dollars", "1200", {"score": 1.0, "acc": True}),
    ("total: 18.00", "18", {"score": 1.0, "acc": True}),
    ("it is -4", "-4", {"score": 1.0, "acc": True}),
    ("it is 5", "72", {"score": 0.0, "acc": False}),
    ("no number", "72", {"score": 0.0, "acc": False}),
])
def test_custom_gsm8k_reward(text, truth, expected):
    assert custom_gsm8k("openai/gsm8k", text, truth) == expected
