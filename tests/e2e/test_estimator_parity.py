"""N workers train like one, for every registered advantage estimator: 2 steps on 1 CPU
worker and on 2 (gloo, same global batch), the losses, gradient norms and advantage
statistics within 1e-5 (relative above 1).

By default the estimators with statistics over the whole batch run (whitening: gae,
reinforce_plus_plus, reinforce_plus_plus_baseline; GPG's alpha; CPGD's B / m) and GRPO;
``SIIRL_PARITY=all`` (``nox -s parity``) runs every registered one, MARFT's gae_marft on
siiRL's multi-agent workflow file included. Each world size trains its estimators one
after another in the same processes (``siirl_estimator_parity.py``).
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
from siirl_estimator_parity import RUNS  # noqa: E402

TOL = 1e-5
FAST = ["grpo", "gae", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gpg", "cpgd"]
NAMES = sorted(RUNS) if os.environ.get("SIIRL_PARITY") == "all" else FAST
# what must agree: every loss, gradient norm, advantage/return/value statistic and
# response length; not timings, throughputs or the learning rate schedule
COMPARED = ("actor/", "critic/", "response_length/")


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
    assert set(FAST) <= set(RUNS)


def _compared(record):
    return {key: value for key, value in record.items()
            if isinstance(value, (int, float)) and "/lr" not in key
            and any(key.startswith(p) or f"/{p}" in key for p in COMPARED)}


@pytest.mark.parametrize("name", NAMES)
def test_two_workers_train_like_one(histories, name):
    one, two = histories[0][name], histories[1][name]
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2]
    for a, b in zip(one, two, strict=True):
        want, got = _compared(a), _compared(b)
        assert sorted(got) == sorted(want)
        assert any("grad_norm" in key for key in want) and \
            any("advantages/mean" in key for key in want)
        worst = max(want, key=lambda k: abs(want[k] - got[k]) / max(1.0, abs(want[k])))
        diff = abs(want[worst] - got[worst]) / max(1.0, abs(want[worst]))
        assert diff <= TOL, (f"{name} step {a['step']}: {worst} is {want[worst]!r} on 1 "
                             f"worker, {got[worst]!r} on 2 (relative difference {diff:.1e})")
