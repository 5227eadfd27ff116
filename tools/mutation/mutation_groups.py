"""The module groups of mutation testing (``tools/mutation/run.py``): what each mutates,
what it leaves alone and why, and the tests run against each mutant."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "build" / "mutmut"


@dataclass(frozen=True)
class Group:
    """One mutation run: ``package`` (a folder under ``src``) is copied, the files matching
    ``mutate`` (globs relative to ``src``) are mutated, ``tests`` are run against them."""

    src: str
    package: str
    mutate: tuple[str, ...]
    tests: tuple[str, ...]
    deselect: tuple[str, ...] = ()  # tests that break when run out of order (see GROUPS)
    skip: tuple[str, ...] = ()  # globs (relative to src) of modules not to mutate
    why_skipped: str = ""
    options: dict = field(default_factory=dict)  # extra [tool.mutmut] keys


CORE = "packages/siirl-core/src"
DATA = "packages/siirl-data/src"
ENGINE = "packages/siirl-engine/src"

GROUPS: dict[str, Group] = {
    "core_algos": Group(
        src=CORE,
        package="siirl/dag_worker",
        mutate=("siirl/dag_worker/core_algos/*",),
        tests=("tests/core/dag_worker/core_algos/test_core_algos_advantages.py",
               "tests/core/dag_worker/core_algos/test_core_algos_kl.py",
               "tests/core/dag_worker/core_algos/test_core_algos_losses.py",
               "tests/core/dag_worker/core_algos/test_core_algos_policy_losses.py",
               "tests/core/dag_worker/core_algos/test_core_algos_mutants.py",
               "tests/core/dag_worker/multi_agent/test_agent_groups.py"),  # MARFT's GAE (gae_marft)
    ),
    "data_buffer": Group(
        src=DATA,
        package="siirl/data_coordinator",
        mutate=("siirl/data_coordinator/data_buffer.py",),
        # test_two_ranks / test_four_ranks spawn their ranks (seconds of imports each):
        # test_data_buffer_mutants.py runs the same scenarios and checks with forked ranks
        tests=("tests/data/test_data_buffer.py::test_layout_and_plan",
               "tests/data/test_data_buffer_mutants.py"),
    ),
    "dataloader": Group(
        src=DATA,
        package="siirl/data_coordinator",
        mutate=("siirl/data_coordinator/dataloader/*",),
        tests=("tests/data/test_partitioned_dataset.py",
               "tests/data/test_stateful_loader.py",
               "tests/data/test_dataloader_mutants.py"),
    ),
    "checkpoint": Group(
        src=CORE,
        package="siirl/dag_worker",
        mutate=("siirl/dag_worker/checkpoint/*",),
        tests=("tests/core/dag_worker/checkpoint/test_checkpoint_manager.py",
               "tests/core/dag_worker/checkpoint/test_checkpoint_state.py",
               "tests/core/dag_worker/checkpoint/test_checkpoint_manager_mutants.py"),
    ),
    "reward": Group(
        src=ENGINE,
        package="siirl/engine",
        mutate=("siirl/engine/reward_manager/*",),
        skip=("siirl/engine/reward_manager/_pool.py",
              "siirl/engine/reward_manager/_process.py",
              "siirl/engine/reward_manager/worker_main.py"),
        why_skipped="the worker processes (starting, feeding, timing out, killing them): "
                    "only the containment tests reach them, each a few seconds of real "
                    "processes (tests/engine/reward_manager, ~30 s), too slow to run per "
                    "mutant; they are checked end to end by that suite",
        # not test_parallel_reward_manager.py: the parallel manager is its worker pool
        # (_pool.py, skipped above); seconds of worker processes per mutant
        tests=("tests/engine/reward/test_reward_managers.py",
               "tests/engine/reward/test_embodied_reward.py",
               "tests/engine/reward/test_reward_plugin_wiring.py",
               "tests/engine/reward/test_reward_function_calls.py",
               "tests/engine/reward/test_reward_results.py",
               "tests/engine/reward/test_reward_manager_lookup.py",
               "tests/engine/reward/test_reward_manager_base.py",
               "tests/engine/reward/test_reward_masks_and_embodied.py"),
    ),
}

# A mutant gets (its tests' clean CPU time + 5 s) x 10 x 2 CPU seconds before it counts as
# a timeout (mutmut's defaults are x15 and + 1 s: too tight for tests that start processes).
COMMON_OPTIONS = {
    "use_git_change_detection": False,  # the working folder's files are copies
    "timeout_multiplier": 10.0,
    "timeout_constant": 5.0,
}
