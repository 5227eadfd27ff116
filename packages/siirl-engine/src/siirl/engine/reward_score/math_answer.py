"""MATH-style reward: compare the last ``\\boxed{...}`` answer after normalisation.

The normaliser follows the one published with the Hendrycks MATH dataset (also used by
verl's ``math_reward``): it removes LaTeX that does not change the value (``\\left``,
``\\!``, ``^\\circ``, ``\\$``, a trailing unit in ``\\text{ ...}``) so that the string
comparison is not defeated by typesetting. Numeric equivalence (``0.5`` vs ``1/2``
beyond the ``0.5`` special case the normaliser has) is deliberately out of scope.
"""

from __future__ import annotations

import re
from typing import Any

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` / ``\\fbox{...}`` with balanced braces.

    ``\\boxed 5`` (no braces) gives the token up to the next ``$`` or space. None when
    there is no box or its braces are not closed (a truncated response).
    """
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    rest = text[start:]
    command = next(cmd for cmd in _BOX_COMMANDS if rest.startswith(cmd))
    rest = rest[len(command):]
    if rest.startswith(" "):
        return rest[1:].split("$")[0].split(" ")[0] or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None


def _fix_fracs(s: str) -> str:
    # "\frac12" -> "\frac{1}{2}", "\frac1{72}" -> "\frac{1}{72}": both spellings are common.
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part.startswith("{") or len(part) < 2:
            out += part
            continue
        a, b, tail = part[0], part[1], part[2:]
        out += "{" + a + "}" + (b + tail if b == "{" else "{" + b + "}" + tail)
    return out


def _fix_a_slash_b(s: str) -> str:
    # "3/4" -> "\frac{3}{4}" only for two plain integers, as in the reference normaliser.
    match = re.fullmatch(r"(\d+)/(\d+)", s)
    return f"\\frac{{{match.group(1)}}}{{{match.group(2)}}}" if match else s


def _fix_sqrt(s: str) -> str:
    # "\sqrt3" -> "\sqrt{3}"
    return re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)


def _remove_right_units(s: str) -> str:
    # "5 \text{ cm}" -> "5 ": a unit written after the value is not part of the answer.
    return s.split("\\text{ ")[0] if "\\text{ " in s else s


def normalize_answer(s: str) -> str:
    """Canonical string form of a MATH answer (Hendrycks normaliser + trailing '.')."""
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    s = _remove_right_units(s)
    s = s.replace("\\%", "")
    s = s.strip().rstrip(".").strip()  # "5." at the end of a sentence is "5"
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    # "x = 5" -> "5" when the left side is a short variable name
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0].strip()) <= 2:
        s = sides[1]
    s = _fix_sqrt(s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def compute_score(solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 when the last boxed answer matches the ground truth after normalisation."""
    answer = last_boxed(solution_str)
    if answer is None:
        return 0.0
    truth = str(ground_truth)
    # Datasets store either the bare answer or the full solution; accept both.
    boxed_truth = last_boxed(truth)
    if boxed_truth is not None:
        truth = boxed_truth
    return 1.0 if normalize_answer(answer) == normalize_answer(truth) else 0.0
