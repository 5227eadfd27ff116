"""The chat_arithmetic task's reward: the response's last integer is its answer."""

from siirl.data_coordinator.tasks import chat_arithmetic
from siirl.engine.reward_score import default_compute_score


def _key(row):
    e = row["extra_info"]
    return e["a"], e["op"], e["b"]


def test_the_answer_is_the_last_integer():
    row = chat_arithmetic.make_splits(10, 5)[1][0]
    truth = row["reward_model"]["ground_truth"]
    a, op, b = _key(row)
    wrong = str(int(truth) + 1)

    def score(text):
        return default_compute_score("chat_arithmetic", text, truth)["score"]

    assert score(truth) == 1.0 and score(f"The answer is {truth}.") == 1.0
    assert score(f"{a} {op} {b} = {truth}") == 1.0
    assert score(f"{a} {op} {b} = {wrong}") == 0.0
    assert score(f"{truth} is wrong, it is {wrong}") == 0.0  # the last integer counts
    assert score("To solve this problem, we need to") == 0.0
    assert default_compute_score("chat_arithmetic", "-3", "-3")["score"] == 1.0
