"""The math environment of the MARFT workflow: the last agent's answer of each turn is
checked against the ground truth; a right answer ends the episode with score 1, a wrong one
is marked so and the agents try again (up to multi_turn.max_assistant_turns turns).

An answer is the last ``\\boxed{...}`` of the agent's reply or, without one, its first
integer (the built-in arithmetic task's answers)."""

from siirl.engine.reward_score.arithmetic import first_integer
from siirl.engine.reward_score.math_answer import compute_score as boxed_score
from siirl.engine.reward_score.math_answer import last_boxed


def latest_reply(actions):
    """What the last agent added this turn (the texts are the episode after each agent)."""
    last = actions[-1]
    if len(actions) > 1 and last.startswith(actions[-2]):
        return last[len(actions[-2]):]
    return last


def score_answer(reply, ground_truth):
    if last_boxed(reply) is not None:
        return boxed_score(reply, ground_truth)
    answer = first_integer(reply)
    return 1.0 if answer is not None and str(answer) == str(ground_truth).strip() else 0.0


class MathEnv:
    def reset(self):
        pass

    async def step(self, actions, ground_truth):
        score = score_answer(latest_reply(actions), ground_truth)
        verdict = " This answer is right." if score == 1.0 else " This answer is wrong."
        return [text + verdict for text in actions], score, score == 1.0
