"""trainer.val_greedy_and_sampled: validation plays the set with both decodings and logs
each under its own name (val/greedy/..., val/sampled/...); val/... stays val_kwargs'."""

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

from siirl.dag_worker.walk.validator import val_kwargs_decoding, validate
from siirl.data_coordinator.fields import COMPLETE, DATA_SOURCE, RESPONSE_MASK, TOKEN_LEVEL_SCORES
from siirl.data_coordinator.protocol import make_batch, set_non_tensor
from siirl.errors import ConfigError


class Rollout:
    """Decodes as the validator's override (or val_kwargs) says; records each pass."""

    def __init__(self, val_kwargs_greedy):
        self.val_kwargs_greedy, self.override, self.passes = val_kwargs_greedy, None, []

    @contextmanager
    def overridden(self, val_sampled=None):
        self.override = val_sampled
        try:
            yield
        finally:
            self.override = None

    def greedy(self):
        return self.val_kwargs_greedy if self.override is None else not self.override


def worker_for(rollout, both=True, do_sample=False, temperature=0.0, engine=None):
    def scored(batch):
        greedy = rollout.greedy()
        rollout.passes.append("greedy" if greedy else "sampled")
        rows = len(batch)
        # greedy wins 3 of 4 episodes, sampling 1 of 4: the two passes are told apart
        wins = [1.0 if i < (3 if greedy else 1) else 0.0 for i in range(rows)]
        out = make_batch({TOKEN_LEVEL_SCORES: torch.tensor(wins)[:, None],
                          RESPONSE_MASK: torch.ones(rows, 1), COMPLETE: torch.tensor(wins)})
        set_non_tensor(out, DATA_SOURCE, ["reach"] * rows)
        return SimpleNamespace(batch=out)

    config = SimpleNamespace(
        trainer=SimpleNamespace(val_greedy_and_sampled=both, validation_data_dir=None,
                                log_val_generations=0),
        actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(
            val_kwargs=SimpleNamespace(do_sample=do_sample, temperature=temperature))))
    return SimpleNamespace(config=config, engines={"rollout": engine or rollout},
                           scored_rollout=lambda: scored)


BATCHES = [make_batch({"x": torch.zeros(4, 1)})]


def test_greedy_val_kwargs_also_sample_and_name_both():
    rollout = Rollout(val_kwargs_greedy=True)
    metrics = validate(worker_for(rollout), BATCHES)
    assert rollout.passes == ["sampled", "greedy"]  # val_kwargs' pass last (its dumps)
    assert metrics["val/success_rate"] == metrics["val/greedy/success_rate"] == 0.75
    assert metrics["val/sampled/success_rate"] == 0.25
    assert metrics["val/sampled/reach/success_rate"] == 0.25
    assert metrics["val/greedy/score/mean"] == 0.75


def test_sampling_val_kwargs_also_decode_greedily():
    rollout = Rollout(val_kwargs_greedy=False)
    metrics = validate(worker_for(rollout, do_sample=True, temperature=1.0), BATCHES)
    assert rollout.passes == ["greedy", "sampled"]
    assert metrics["val/success_rate"] == metrics["val/sampled/success_rate"] == 0.25
    assert metrics["val/greedy/success_rate"] == 0.75


def test_off_by_default_one_pass_and_no_named_metrics():
    rollout = Rollout(val_kwargs_greedy=True)
    metrics = validate(worker_for(rollout, both=False), BATCHES)
    assert rollout.passes == ["greedy"]
    assert metrics["val/success_rate"] == 0.75
    assert not any(key.startswith(("val/greedy/", "val/sampled/")) for key in metrics)


@pytest.mark.parametrize("do_sample, temperature, decoding", [
    (False, 0.0, "greedy"), (True, 0.0, "greedy"), (False, 1.0, "greedy"),
    (True, 0.7, "sampled")])
def test_val_kwargs_decoding_is_the_rollouts_reading(do_sample, temperature, decoding):
    config = worker_for(Rollout(True), do_sample=do_sample, temperature=temperature).config
    assert val_kwargs_decoding(config) == decoding


def test_a_rollout_that_cannot_switch_is_refused_by_name():
    worker = worker_for(Rollout(True), engine=object())
    with pytest.raises(ConfigError, match="trainer.val_greedy_and_sampled"):
        validate(worker, BATCHES)
