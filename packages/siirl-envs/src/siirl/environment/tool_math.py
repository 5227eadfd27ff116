"""Tool-use math (``env_type: tool_math``): arithmetic a small model cannot do in its head,
with a calculator it may call before answering.

The question comes from the episode's seed (``operands`` numbers in ``[low, high]`` joined
by + - *). Each turn the agent either calls the calculator, ``<tool>calculator: 37*48</tool>``
(the observation is the result, or the tool's error text: a failing tool never ends the
episode), or answers, ``<answer>1647</answer>`` (reward 1 when right, 0 when wrong; the
episode ends). ``max_tool_calls`` bounds the calls; more are answered with a refusal.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from typing import Optional

from siirl.environment.base import StepResult, TextEnv
from siirl.errors import ConfigError

_BLOCK = re.compile(r"<(tool|answer)>(.*?)</\1>", re.DOTALL | re.IGNORECASE)
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10 ** 30


def calculate(expression: str) -> float:
    """The value of an arithmetic expression (numbers, + - * / // % **, parentheses);
    ValueError with the reason for anything else."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"cannot parse {expression.strip()!r}: {exc.msg}") from None

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
                and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is too large")
            try:
                result = _BINARY[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ValueError("division by zero") from None
            if abs(result) > MAX_MAGNITUDE:
                raise ValueError("result too large")
            return result
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        raise ValueError(f"only numbers and + - * / // % ** are allowed, not "
                         f"{ast.unparse(node)!r}")

    return value(tree)


def _number(text: str) -> str:
    value = float(text)
    return str(int(value)) if value == int(value) else f"{value:g}"


class ToolMath(TextEnv):
    instructions = (
        "Answer the arithmetic question. You may use a calculator first: reply "
        "<tool>calculator: EXPRESSION</tool> and you get the result. When you know the "
        "answer, reply <answer>NUMBER</answer>.")

    def __init__(self, operands: int = 3, low: int = 10, high: int = 99,
                 max_tool_calls: int = 4):
        if int(operands) < 2:
            raise ConfigError(f"tool_math: operands={operands} must be at least 2")
        if int(low) > int(high):
            raise ConfigError(f"tool_math: low={low} must not exceed high={high}")
        self.operands, self.low, self.high = int(operands), int(low), int(high)
        self.max_tool_calls = int(max_tool_calls)
        self.question, self.answer, self.tool_calls = "", 0, 0

    def reset(self, seed: Optional[int] = None) -> str:
        rng = random.Random(seed)
        terms = [str(rng.randint(self.low, self.high)) for _ in range(self.operands)]
        ops = [rng.choice("+-*") for _ in range(self.operands - 1)]
        self.question = terms[0] + "".join(f" {op} {term}"
                                           for op, term in zip(ops, terms[1:], strict=True))
        self.answer = int(calculate(self.question))
        self.tool_calls = 0
        return f"What is {self.question}?"

    def parse_action(self, reply: str) -> Optional[str]:
        """``calculator: EXPR`` or ``answer: TEXT`` from the last tool or answer block."""
        found = _BLOCK.findall(reply or "")
        if not found:
            return None
        kind, body = found[-1]
        if kind.lower() == "answer":
            return f"answer: {body.strip()}"
        name, _, expression = body.partition(":")
        return f"calculator: {expression.strip()}" if name.strip().lower() == "calculator" \
            and expression.strip() else None

    def step(self, action: str) -> StepResult:
        kind, _, body = str(action).partition(":")
        kind, body = kind.strip().lower(), body.strip()
        if kind == "calculator":
            self.tool_calls += 1
            if self.tool_calls > self.max_tool_calls:
                text = f"calculator: no more calls (at most {self.max_tool_calls}); answer now"
            else:
                try:
                    text = f"calculator: {body} = {_number(str(calculate(body)))}"
                except ValueError as exc:
                    text = f"calculator error: {exc}"
            return text, 0.0, False, {"success": False, "action_is_valid": True,
                                      "tool_calls": self.tool_calls}
        if kind == "answer":
            try:
                right = float(body.replace(",", "")) == self.answer
            except ValueError:
                right = False
            return ("correct" if right else "wrong"), float(right), True, {
                "success": right, "action_is_valid": True, "tool_calls": self.tool_calls}
        return ("unknown action: use <tool>calculator: ...</tool> or <answer>...</answer>",
                0.0, False, {"success": False, "action_is_valid": False,
                             "tool_calls": self.tool_calls})

    def render(self) -> str:
        return f"{self.question} = {self.answer} ({self.tool_calls} tool call(s))"


def solve(env: ToolMath) -> list:
    """The scripted agent: one calculator call, then the answer (replies, not actions)."""
    return [f"<tool>calculator: {env.question}</tool>", f"<answer>{env.answer}</answer>"]
