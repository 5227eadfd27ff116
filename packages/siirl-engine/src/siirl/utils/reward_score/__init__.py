"""siiRL's ``siirl.utils.reward_score``: ``default_compute_score``, the rule a row's
``data_source`` picks (``siirl.engine.reward_score``: GSM8K, MATH, the built-in task), under
siiRL's name and signature, for custom reward functions that fall back on it.

The package spans distributions: ``math`` and ``gsm8k`` are siirl-engine's, ``prime_code``
siirl-envs'; its path extends over every ``siirl/utils/reward_score`` folder on
``sys.path``, as a namespace package's would.
"""

from __future__ import annotations

from pkgutil import extend_path
from typing import Any, Dict

from siirl.engine import reward_score as _rules

__path__ = extend_path(__path__, __name__)


def default_compute_score(data_source: str, solution_str: str, ground_truth: Any,
                          extra_info: Any = None, sandbox_fusion_url: Any = None,
                          concurrent_semaphore: Any = None) -> float | Dict[str, Any]:
    """The score of ``solution_str`` by the built-in rule for ``data_source``
    (``siirl.engine.reward_score.SCORERS``); a source without one raises ``ConfigError``
    naming the known sources and ``custom_reward_function.path``.

    ``sandbox_fusion_url`` and ``concurrent_semaphore`` are siiRL's for its code data
    sources (codecontests, apps, ...), which have no built-in rule here: the sources that
    score ignore them, as in siiRL.
    """
    return _rules.default_compute_score(data_source, solution_str, ground_truth, extra_info)


__all__ = ["default_compute_score"]
