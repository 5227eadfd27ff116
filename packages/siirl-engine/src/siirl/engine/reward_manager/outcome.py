"""What one reward call produced for one sample: a checked score, or a failure and its kind.

Torch-free: the reward worker processes import it to check results before sending them.
A result is accepted when it is a real number (bool, int, float, a numpy scalar or a
one-element tensor) or a dict with such a ``"score"``; its magnitude must be at most
``MAX_ABS_SCORE``. Beyond that bound the value is almost surely a bug (an overflow, a
count), and in float32 its square overflows the group statistics of GRPO, so the step's
advantages would turn into NaN and the update would be dropped: it is a ``non_finite``
failure like NaN and inf.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Sequence, Union

from siirl.errors import ConfigError

MAX_ABS_SCORE = 1e9

# Why a sample scored 0.0: ``timeout`` (a call or the step ran out of time), ``exception``
# (the function raised), ``exit`` (sys.exit, or the worker process exited), ``crash`` (the
# worker died of a signal: SIGSEGV, SIGKILL...), ``non_finite`` (NaN, inf, beyond
# MAX_ABS_SCORE), ``non_numeric`` (a string, None, a dict without "score"...).
KINDS = ("timeout", "exception", "exit", "crash", "non_finite", "non_numeric")


@dataclass
class Scored:
    score: float
    extras: Dict[str, Any] = field(default_factory=dict)  # a dict result's other keys


@dataclass
class Failure:
    kind: str  # one of KINDS
    reason: str


Outcome = Union[Scored, Failure]
Row = Sequence[Any]  # (data_source, solution_str, ground_truth, extra_info)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _number(value: Any) -> Any:
    """``value`` as a Python float, or None when it is no real number."""
    if isinstance(value, numbers.Real):  # bool, int, float, Fraction, numpy scalars
        return float(value)
    item = getattr(value, "item", None)  # a one-element tensor or array
    size = getattr(value, "numel", None) or getattr(value, "size", None)
    size = size() if callable(size) else size
    if callable(item) and size == 1 and not isinstance(value, (str, bytes)):
        inner = item()
        return float(inner) if isinstance(inner, numbers.Real) else None
    return None


def check_result(result: Any) -> Outcome:
    """The score of one sample from what the function returned."""
    value, extras = result, {}
    if isinstance(result, dict):
        if "score" not in result:
            return Failure("non_numeric", f"returned a dict without a 'score' key "
                                          f"(keys: {', '.join(map(str, result)) or 'none'})")
        value = result["score"]
        extras = {k: v for k, v in result.items() if k != "score"}
    number = _number(value)
    if number is None:
        return Failure("non_numeric", f"returned {_short(value)} ({type(value).__name__}), "
                                      "not a number or a dict with a numeric 'score'")
    if not math.isfinite(number) or abs(number) > MAX_ABS_SCORE:
        why = "not finite" if not math.isfinite(number) else \
            f"beyond the bound of +-{MAX_ABS_SCORE:g} on rewards"
        return Failure("non_finite", f"returned {number!r}: {why}")
    return Scored(number, extras)


def call_row(fn: Callable[..., Any], row: Row, kwargs: Dict[str, Any]) -> Outcome:
    """One per-sample call. ``ConfigError`` (e.g. a data_source no built-in rule knows) is
    a bad setup, not a bad sample: it propagates. So does ``KeyboardInterrupt``."""
    data_source, solution, ground_truth, extra_info = row
    try:
        result = fn(data_source=data_source, solution_str=solution,
                    ground_truth=ground_truth, extra_info=extra_info, **kwargs)
    except ConfigError:
        raise
    except SystemExit as exc:
        return Failure("exit", f"the function called sys.exit({exc.code!r})")
    except Exception as exc:
        return Failure("exception", f"{type(exc).__name__}: {exc}")
    return check_result(result)


def call_batch(fn: Callable[..., Any], rows: Sequence[Row], kwargs: Dict[str, Any]) -> Any:
    """One call of a ``batch`` function on whole lists: a list of outcomes, a Failure of
    the whole call, or ``("bad_result", message)`` when it returned no list of the right
    length (a bug of the function, raised as ConfigError by the caller)."""
    columns = [list(column) for column in zip(*rows, strict=True)] if rows else [[]] * 4
    try:
        results = fn(*columns, **kwargs)
    except ConfigError:
        raise
    except SystemExit as exc:
        return Failure("exit", f"the function called sys.exit({exc.code!r})")
    except Exception as exc:
        return Failure("exception", f"{type(exc).__name__}: {exc}")
    try:
        results = list(results)
    except TypeError:
        return ("bad_result", f"returned {type(results).__name__}, expected a list")
    if len(results) != len(rows):
        return ("bad_result", f"returned {len(results)} results for {len(rows)} rows")
    return [check_result(r) for r in results]
