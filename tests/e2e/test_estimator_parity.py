"""N workers train like one, for every registered advantage estimator: 2 steps on 1 CPU
worker and on 2 (gloo, same global batch), the losses, gradient norms and advantage
statistics within 1e-5 (relative above 1).

By default the estimators with statistics over the whole batch run (whitening: gae,
reinforce_plus_plus, reinforce_plus_plus_baseline; GPG's alpha; CPGD's B / m) and GRPO;
``SIIRL_PARITY=all`` (``nox -s parity``) runs every registered one, MARFT's gae_marft on
siiRL's multi-agent workflow file included. Each world size trains its estimators one
after another in the same processes (``siirl_estimator_parity.py``).

The AGENTIC and EMBODIED workflows too (``WORKFLOWS``), their episode, reward and sampling
statistics compared as well: by default GRPO on FrozenLake episodes with scores
standardized over the batch, PPO on turn rows, and SRPO on one embodied task (a failure's
progress reward then depends on the other worker's successes, and some failure earns one);
``SIIRL_PARITY=all`` adds embodied GRPO on four tasks.

Several optimizer steps per training step too (``MINI_BATCH_RUNS``, by default): GRPO and
PPO/GAE with each step's prompts in 2 PPO mini-batches, which the dataloader lays out so
that the 2 workers' k-th local mini-batches are together 1 worker's k-th; and GRPO whose
2 workers roll out at tensor-parallel size 2, the DataBuffer keeping that layout when it
hands the rows on to data-parallel training.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from siirl.dag_worker.core_algos import registered_adv_estimators

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from siirl_estimator_parity import MINI_BATCH_RUNS, RUNS, WORKFLOWS  # noqa: E402

TOL = 1e-5
FAST = ["grpo", "gae", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gpg", "cpgd"]
FAST_WORKFLOWS = ["agentic_grpo", "agentic_gae_step", "embodied_srpo"]
ALL = os.environ.get("SIIRL_PARITY") == "all"
ESTIMATORS = (sorted(RUNS) if ALL else FAST) + sorted(MINI_BATCH_RUNS)
FLOWS = sorted(WORKFLOWS) if ALL else FAST_WORKFLOWS
NAMES = ESTIMATORS + FLOWS
# what must agree: every loss, gradient norm, advantage/return/value statistic and
# response length; not timings, throughputs or the learning rate schedule; for the
# workflows also the episodes', rewards' and sampling filter's statistics
COMPARED = ("actor/", "critic/", "response_length/")
EPISODES = ("env/", "reward/", "embodied_sampling/")


def _train(world, out):
    proc = subprocess.run([sys.executable, str(HERE / "siirl_estimator_parity.py"), str(world),
                           str(out), *NAMES], capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {name: json.loads((out / f"{name}.json").read_text()) for name in NAMES}


@pytest.fixture(scope="module")
def histories(tmp_path_factory):
    return (_train(1, tmp_path_factory.mktemp("one")),
            _train(2, tmp_path_factory.mktemp("two")))


def test_every_registered_estimator_has_a_parity_run():
    assert sorted(registered_adv_estimators()) == sorted(RUNS)
    assert set(FAST) <= set(RUNS) and set(FAST_WORKFLOWS) <= set(WORKFLOWS)


def _compared(record, prefixes=COMPARED):
    return {key: value for key, value in record.items()
            if isinstance(value, (int, float)) and "/lr" not in key
            and any(key.startswith(p) or f"/{p}" in key for p in prefixes)}


@pytest.mark.parametrize("name", FLOWS)
def test_two_workers_play_and_train_a_workflow_like_one(histories, name):
    one = histories[0][name]
    # every step trained on something: the comparison below is not of idle updates
    assert all(r["actor/grad_norm"] > 0 for r in one), [r["actor/grad_norm"] for r in one]
    if name == "embodied_srpo":  # some failure was scored against the batch's successes
        assert any(r["reward/progress/count"] > 0 for r in one)
    _assert_alike(name, one, histories[1][name], COMPARED + EPISODES)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_two_workers_train_like_one(histories, name):
    _assert_alike(name, histories[0][name], histories[1][name], COMPARED)


def _assert_alike(name, one, two, prefixes):
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2]
    for a, b in zip(one, two, strict=True):
        want, got = _compared(a, prefixes), _compared(b, prefixes)
        assert sorted(got) == sorted(want)
        assert any("grad_norm" in key for key in want) and \
            any("advantages/mean" in key for key in want)
        worst = max(want, key=lambda k: abs(want[k] - got[k]) / max(1.0, abs(want[k])))
        diff = abs(want[worst] - got[worst]) / max(1.0, abs(want[worst]))
        assert diff <= TOL, (f"{name} step {a['step']}: {worst} is {want[worst]!r} on 1 "
                             f"worker, {got[worst]!r} on 2 (relative difference {diff:.1e})")
