"""The code environment of the MARFT code workflow: the coder's reply of each turn is run
as a Python program (a separate process with a 5 s timeout, in a temporary folder) and
checked against the ground truth: ``{"inputs": [...], "outputs": [...]}`` test cases (stdin
-> expected stdout, as a dict or its JSON text) or one expected output. The score is the
fraction of cases passed; passing all ends the episode."""

import json
import re
import subprocess
import sys
import tempfile

_FENCE = re.compile(r"```(?:python)?\n(.*?)(?:```|$)", re.DOTALL)


def latest_reply(actions):
    """What the last agent added this turn (the texts are the episode after each agent)."""
    last = actions[-1]
    if len(actions) > 1 and last.startswith(actions[-2]):
        return last[len(actions[-2]):]
    return last


def program_of(reply):
    blocks = _FENCE.findall(reply)
    return blocks[-1] if blocks else reply


def test_cases(ground_truth):
    if isinstance(ground_truth, str):
        try:
            ground_truth = json.loads(ground_truth)
        except ValueError:
            return [("", ground_truth)]
    if isinstance(ground_truth, dict) and "inputs" in ground_truth:
        return list(zip(ground_truth["inputs"], ground_truth["outputs"], strict=True))
    return [("", str(ground_truth))]


def run(program, stdin, timeout_s=5.0):
    with tempfile.TemporaryDirectory() as folder:
        try:
            done = subprocess.run([sys.executable, "-I", "-c", program], input=stdin,
                                  capture_output=True, text=True, timeout=timeout_s, cwd=folder)
        except subprocess.TimeoutExpired:
            return None
    return done.stdout if done.returncode == 0 else None


class CodeEnv:
    def reset(self):
        pass

    async def step(self, actions, ground_truth):
        program = program_of(latest_reply(actions))
        cases = test_cases(ground_truth)
        passed = sum(1 for stdin, expected in cases
                     if (run(program, str(stdin)) or "").strip() == str(expected).strip())
        score = passed / len(cases) if cases else 0.0
        verdict = ". This answer is right." if score == 1.0 else ". This answer is wrong."
        return [text + verdict for text in actions], float(score), score == 1.0
