"""The steps of "Add a loss" in docs/architecture.md: a policy loss registered by the user's
module under a new name is chosen by ``policy_loss.loss_mode`` with no edit in
siirl.params or core_algos."""

import importlib
import sys
import textwrap

import pytest
import torch

from siirl.dag_worker import core_algos
from siirl.dag_worker.core_algos import names
from siirl.params.parser import parse_config
from siirl.params.validation import InvalidConfigError

NAME = "test_doc_halved_vanilla"
KEY = "actor_rollout_ref.actor.policy_loss.loss_mode"
MODULE = textwrap.dedent(f'''
    from siirl.dag_worker.core_algos import compute_policy_loss_vanilla, register_policy_loss


    @register_policy_loss("{NAME}")
    def halved_vanilla(old_log_prob, log_prob, advantages, response_mask,
                       loss_agg_mode="token-mean", config=None, rollout_log_probs=None):
        pg_loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss_vanilla(
            old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config)
        return pg_loss / 2, clipfrac, ppo_kl, clipfrac_lower
''')


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_losses.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_losses"
    names.POLICY_LOSSES._entries.pop(NAME, None)
    sys.modules.pop("my_losses", None)


def test_a_registered_loss_is_chosen_by_its_name(user_module):
    # step 3 before step 2: the name is not registered, and no user code could register it
    with pytest.raises(InvalidConfigError, match=f"{KEY}='{NAME}': must be a registered "
                       "policy loss"):
        parse_config([f"{KEY}={NAME}"], validate=True)
    # with the module named in external_lib the registry checks the name when it loads
    parse_config([f"{KEY}={NAME}", f"actor_rollout_ref.model.external_lib={user_module}"],
                 validate=True)
    importlib.import_module(user_module)  # what the model loader does with external_lib
    parse_config([f"{KEY}={NAME}"], validate=True)  # the validation pass reads the registry
    assert NAME in core_algos.registered_policy_losses()

    torch.manual_seed(0)
    old, new = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    advantages, mask = torch.randn(2, 3, dtype=torch.float64), torch.ones(2, 3)
    mine = core_algos.get_policy_loss_fn(NAME)(old, new, advantages, mask)
    vanilla = core_algos.get_policy_loss_fn("vanilla")(old, new, advantages, mask)
    assert mine[0].item() == vanilla[0].item() / 2  # halving a float is exact
