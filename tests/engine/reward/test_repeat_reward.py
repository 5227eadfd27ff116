"""The built-in repeat task's rule reward: exact match, EOS and padding stripped."""

import pytest

from siirl.engine.reward_score import SCORERS, default_compute_score


@pytest.mark.parametrize("response, truth, acc", [
    ("ababab", "ababab", True),
    (" ababab\n", "ababab", True),
    ("ababab</s>", "ababab", True),
    ("ababab</s><pad><pad>", "ababab", True),
    ("abababab", "ababab", False),  # one repetition too many
    ("abab", "ababab", False),  # too few
    ("ababac", "ababab", False),
    ("</s>", "ababab", False),
    ("", "a", False),
    ("ab ab ab", "ababab", False),
])
def test_repeat(response, truth, acc):
    assert "repeat" in SCORERS
    result = default_compute_score("repeat", response, truth)
    assert result == {"score": 1.0 if acc else 0.0, "acc": acc}
