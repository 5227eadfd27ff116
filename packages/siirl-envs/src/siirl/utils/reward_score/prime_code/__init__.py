"""siiRL's ``siirl.utils.reward_score.prime_code`` (MARFT's code environment imports it):
run a program against test cases, each in the local sandbox (``siirl.environment.tools.
sandbox``: no network, bounded time and memory).

``compute_score(completion, test_cases, continuous=False) -> (success, metadata)``: the
program is the completion's last ```` ```python ```` block (else the whole completion);
``test_cases`` (a dict or its JSON text) holds ``inputs`` and ``outputs``: stdin text and the
expected stdout (compared line by line, trailing spaces ignored), or with ``fn_name`` the
arguments of that function (a JSON list) and its expected return value. All cases pass:
``(True, ...)``; else ``(False, ...)``, or with ``continuous`` the fraction of the first ten
cases that pass. ``metadata`` lists each case run: its index, whether it passed and, when it
did not, why.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Tuple

from siirl.environment.tools.sandbox import run_python

TIMEOUT_S = 5.0
MEMORY_MB = 1024
CONTINUOUS_CASES = 10


def program_of(completion: str) -> str:
    return completion.split("```python")[-1].split("```")[0]


def _lines(text: str) -> List[str]:
    lines = [line.rstrip() for line in str(text).strip().splitlines()]
    return lines


def _harness(program: str, case_input: Any, fn_name: str | None) -> str:
    """The program with its stdin (or the call of ``fn_name``) built in."""
    if fn_name:
        args = case_input if isinstance(case_input, list) else json.loads(case_input)
        return (f"{program}\n\nimport json as _siirl_json\n"
                f"print(_siirl_json.dumps({fn_name}(*_siirl_json.loads({json.dumps(json.dumps(args))}))))\n")
    stdin = case_input if isinstance(case_input, str) else "\n".join(map(str, case_input))
    return (f"import io as _siirl_io, sys as _siirl_sys\n"
            f"_siirl_sys.stdin = _siirl_io.StringIO({stdin!r})\n{program}\n")


def _passed(stdout: str, expected: Any, fn_name: str | None) -> bool:
    if fn_name:
        try:
            got = json.loads(stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return False
        return got == expected or (isinstance(expected, list) and len(expected) == 1
                                   and got == expected[0])
    text = expected if isinstance(expected, str) else "\n".join(map(str, expected))
    return _lines(stdout) == _lines(text)


def run_case(program: str, case_input: Any, expected: Any, fn_name: str | None = None,
             index: int = 0) -> Dict[str, Any]:
    result = run_python(_harness(program, case_input, fn_name), TIMEOUT_S, MEMORY_MB, 1 << 16)
    if result.timed_out:
        return {"case": index, "passed": False, "why": "timeout"}
    if result.returncode != 0:
        return {"case": index, "passed": False,
                "why": f"exit {result.returncode}: {result.stderr.strip()[-300:]}"}
    ok = _passed(result.stdout, expected, fn_name)
    return {"case": index, "passed": ok, **({} if ok else {"why": "wrong output"})}


def compute_score(completion: str, test_cases: Any, continuous: bool = False
                  ) -> Tuple[Any, List[Dict[str, Any]]]:
    try:
        cases = json.loads(test_cases) if isinstance(test_cases, str) else dict(test_cases)
        inputs, outputs = list(cases["inputs"]), list(cases["outputs"])
    except (ValueError, TypeError, KeyError) as exc:
        return False, [{"passed": False, "why": f"bad test cases: {exc}"}]
    program, fn_name = program_of(completion), cases.get("fn_name")
    limit = min(len(inputs), CONTINUOUS_CASES) if continuous else len(inputs)
    metadata = []
    for index in range(limit):
        metadata.append(run_case(program, inputs[index], outputs[index], fn_name, index))
        if not continuous and not metadata[-1]["passed"]:
            return False, metadata
    if continuous:
        return sum(m["passed"] for m in metadata) / max(len(metadata), 1), metadata
    return bool(inputs), metadata
