"""Interactions: a simulated user that answers the assistant's final replies (verl's
``rollout.multi_turn.interaction_config_path``), in verl's file format::

    interaction:
      - name: gsm8k                    # a prompt row picks it by
        class_name: my_pkg.MyUser      #   extra_info.interaction_kwargs.name
        config: {}

The class is built as ``cls(config)`` and used through verl's methods (plain or async):
``start_interaction(instance_id, **interaction_kwargs)``,
``generate_response(instance_id, messages) -> (should_terminate, text, score, info)`` and
``finalize_interaction(instance_id)``. An interaction that raises ends its conversation
with its error text recorded; it never ends the run.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
import uuid
from typing import Any, Dict, List, Optional, Tuple

from siirl.errors import ConfigError


def _run(result: Any) -> Any:
    if inspect.isawaitable(result):
        async def wait() -> Any:
            return await result
        return asyncio.run(wait())
    return result


class Session:
    """One conversation's interaction."""

    def __init__(self, interaction: Any, kwargs: Dict[str, Any]):
        self.interaction, self.id = interaction, str(uuid.uuid4())
        self.error: Optional[str] = None
        try:
            _run(interaction.start_interaction(self.id, **kwargs))
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        self.error = f"{type(exc).__name__}: {exc}"
        print(f"[siirl] interaction {type(self.interaction).__name__} failed: {self.error}; "
              "its conversation ends", file=sys.stderr, flush=True)

    def respond(self, messages: List[Dict[str, Any]]) -> Tuple[bool, str, float]:
        if self.error is not None:
            return True, "", 0.0
        try:
            stop, text, score, *_ = _run(self.interaction.generate_response(
                self.id, [dict(m) for m in messages]))
            return bool(stop), str(text), float(score or 0.0)
        except Exception as exc:
            self._failed(exc)
            return True, "", 0.0

    def close(self) -> None:
        finalize = getattr(self.interaction, "finalize_interaction", None)
        if finalize is not None and self.error is None:
            try:
                _run(finalize(self.id))
            except Exception as exc:
                self._failed(exc)


class Interactions:
    def __init__(self, by_name: Dict[str, Any]):
        self.by_name = by_name

    def session(self, extra_info: Any) -> Optional[Session]:
        """A session for a prompt row (``extra_info.interaction_kwargs``), or None."""
        if not self.by_name:
            return None
        kwargs = dict((extra_info or {}).get("interaction_kwargs") or {}) \
            if isinstance(extra_info, dict) else {}
        name = kwargs.get("name") or (next(iter(self.by_name)) if len(self.by_name) == 1
                                      else None)
        if name not in self.by_name:
            return None
        return Session(self.by_name[name], kwargs)


def load_interactions(path: Optional[str]) -> Interactions:
    import yaml

    if not path:
        return Interactions({})
    where = f"rollout.multi_turn.interaction_config_path={path}"
    try:
        with open(path) as handle:
            spec = yaml.safe_load(handle) or {}
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it ({exc})") from None
    found: Dict[str, Any] = {}
    for k, entry in enumerate(spec.get("interaction") or []):
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ConfigError(f"{where}: interaction[{k}] needs name, class_name, config")
        module, _, attr = str(entry["class_name"]).rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ConfigError(f"{where}: interaction[{k}].class_name "
                              f"{entry['class_name']!r} cannot be imported ({exc})") from None
        config = dict(entry.get("config") or {})
        name = str(entry.get("name") or config.get("name") or attr)
        found[name] = cls(config)
    return Interactions(found)
