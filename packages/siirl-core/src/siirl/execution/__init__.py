"""The DAG, its planner and scheduler, and metrics; no engines.

siiRL's public module paths under ``siirl.execution`` that another distribution provides
(``siirl.execution.rollout_flow``: siiRL's multi-turn tool and interaction classes, from
siirl-engine) join this package: its path extends over every ``siirl/execution`` folder on
``sys.path``, as a namespace package's would.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
