"""core_algos behaviour that mutation testing (``nox -s mutmut -- core_algos``) found no test
for: defaults (aggregation mode, KL estimator and coefficients, gamma, f_norm), one-token
responses and one-row batches, zero advantages in the clip metrics, the dual-clip bound
from the config, the lower value clip, and the group rules of CPGD, OPO and GPG.

Each test states a behaviour; docs/mutation.md lists the mutants they kill and the ones
that change nothing observable.
"""

import math

import pytest
import torch
from tensordict import TensorDict

from siirl.dag_worker import core_algos as ca
from siirl.errors import ConfigError

F64 = torch.float64


def t(rows):
    return torch.tensor(rows, dtype=F64)


def outcome(scores, lengths=None, width=3):
    """token_level_rewards with each score on its row's first token, and the mask."""
    lengths = lengths or [width] * len(scores)
    rewards = torch.zeros(len(scores), width, dtype=F64)
    mask = torch.zeros(len(scores), width, dtype=F64)
    for i, (s, n) in enumerate(zip(scores, lengths, strict=True)):
        rewards[i, 0] = s
        mask[i, :n] = 1
    return rewards, mask


def per_row(advantages):
    return advantages[:, 0].tolist()


# ---- defaults --------------------------------------------------------------------------------

LOSSES = {"vanilla": "token-mean", "cpgd": "token-mean", "gpg": "token-mean",
          "geo_mean": "token-mean", "clip_cov": "token-mean", "kl_cov": "token-mean",
          "gspo": "seq-mean-token-mean"}  # GSPO's paper aggregation


@pytest.mark.parametrize("name, mode", sorted(LOSSES.items()))
def test_policy_losses_default_aggregation(name, mode):
    torch.manual_seed(0)
    old, new = torch.randn(3, 4, dtype=F64), torch.randn(3, 4, dtype=F64)
    adv = torch.randn(3, 4, dtype=F64)
    mask = t([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    fn = ca.get_policy_loss_fn(name)
    default = fn(old, new, adv, mask)
    explicit = fn(old, new, adv, mask, mode)
    for a, b in zip(default, explicit, strict=True):
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b))


@pytest.mark.parametrize("name", ["cpgd", "gpg"])
def test_the_aggregation_mode_passed_is_the_one_used(name):
    old = torch.zeros(2, 3, dtype=F64)
    new = t([[-1.0, -2.0, -3.0], [-0.5, 0.0, 0.0]])
    adv = t([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    mask = t([[1, 1, 1], [1, 0, 0]])
    fn = ca.get_policy_loss_fn(name)
    token_mean = fn(old, new, adv, mask, "token-mean")[0]
    seq_sum = fn(old, new, adv, mask, "seq-mean-token-sum")[0]
    per_token = -new * adv  # cpgd: A > 0 caps log_prob at log(1.2), above these
    assert token_mean.item() == pytest.approx((per_token * mask).sum().item() / 4)
    assert seq_sum.item() == pytest.approx((per_token * mask).sum().item() / 2)


def test_value_loss_aggregates_by_token_mean_by_default():
    vpreds, returns, values = t([[1.0, 2.0]]), t([[0.0, 0.0]]), t([[1.0, 2.0]])
    mask = t([[1, 0]])
    assert ca.compute_value_loss(vpreds, returns, values, mask, 0.5)[0].item() == 0.5


def test_the_value_is_clipped_from_below_too():
    """v far below v_old: the clipped prediction v_old - c is worse, and the loss takes it."""
    values, vpreds, returns = t([[0.0]]), t([[-1.0]]), t([[-1.0]])
    loss, clipfrac = ca.compute_value_loss(vpreds, returns, values, t([[1]]), 0.2)
    assert loss.item() == pytest.approx(0.5 * 0.8 ** 2) and clipfrac.item() == 1.0


def test_kl_defaults():
    assert ca.get_kl_controller({}).value == 0.001
    assert ca.get_kl_controller({"type": "adaptive"}).value == 0.001
    assert ca.get_kl_controller({"kl_coef": 0.3}).value == 0.3
    torch.manual_seed(1)
    batch = TensorDict({"token_level_scores": torch.randn(2, 3, dtype=F64),
                        "old_log_probs": torch.randn(2, 3, dtype=F64),
                        "ref_log_prob": torch.randn(2, 3, dtype=F64),
                        "response_mask": torch.ones(2, 3, dtype=torch.long)}, batch_size=[2])
    want = batch["token_level_scores"] - 0.5 * (batch["old_log_probs"] - batch["ref_log_prob"])
    out, _ = ca.apply_kl_penalty(batch, ca.FixedKLController(0.5))  # default estimator: k1
    assert torch.allclose(out["token_level_rewards"], want)


def test_reinforce_plus_plus_discounts_with_gamma_one_by_default_and_for_none():
    rewards, mask = t([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]]), t([[1, 1, 1], [1, 1, 0]])
    one = ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=1.0)
    assert torch.equal(ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask)[0],
                       one[0])
    assert torch.equal(ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask,
                                                                         gamma=None)[0], one[0])


def test_gpg_divides_by_f_norm_one_by_default():
    rewards, mask = outcome([1.0, 0.0, 1.0, 1.0])
    index = ["a", "a", "b", "b"]
    default = ca.compute_gpg_outcome_advantage(rewards, mask, index)[0]
    assert torch.equal(default, ca.compute_gpg_outcome_advantage(rewards, mask, index,
                                                                  f_norm=1.0)[0])
    half = ca.compute_gpg_outcome_advantage(rewards, mask, index, f_norm=2.0)[0]
    assert torch.allclose(half * 2, default)


# ---- one token, one row ----------------------------------------------------------------------

def test_gae_and_reinforce_plus_plus_on_one_token_responses():
    rewards, values, mask = t([[1.0], [0.0]]), t([[0.25], [0.5]]), t([[1], [1]])
    adv, returns = ca.compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8)
    assert returns.tolist() == [[1.0], [0.0]]  # delta = r - V, returns = A + V = r
    adv, returns = ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask)
    assert adv.shape == (2, 1) and returns.tolist() == [[1.0], [0.0]]


def test_geo_mean_on_one_token_rows_and_a_one_row_batch():
    old = torch.zeros(1, 3, dtype=F64)
    new = t([[0.1, 0.0, 0.0]])
    adv = t([[2.0, 2.0, 2.0]])
    mask = t([[1, 0, 0]])  # one token: its own log-ratio is the sequence's mean
    loss = ca.get_policy_loss_fn("geo_mean")(old, new, adv, mask)[0]
    assert loss.item() == pytest.approx(-2.0 * math.exp(0.1))


# ---- zero advantages and the clip metrics ----------------------------------------------------

def test_cpgd_counts_a_zero_advantage_token_as_clipped_only_below_one_minus_low():
    old = torch.zeros(1, 2, dtype=F64)
    new = t([[math.log(2.0), 0.0]])  # ratios 2 and 1
    adv = t([[0.0, 0.0]])
    _, clipfrac, _, _ = ca.get_policy_loss_fn("cpgd")(old, new, adv, t([[1, 1]]))
    assert clipfrac.item() == 0.0  # A <= 0 is clipped below 1 - low only
    new = t([[math.log(0.5), 0.0]])
    assert ca.get_policy_loss_fn("cpgd")(old, new, adv, t([[1, 1]]))[1].item() == 0.5


def test_cpgd_dual_clip_metric_counts_negative_advantages_beyond_clip_ratio_c():
    old = torch.zeros(1, 4, dtype=F64)
    new = torch.full((1, 4), math.log(2.5), dtype=F64)  # ratio 2.5 everywhere
    adv = t([[-1.0, 0.0, 0.5, -2.0]])
    fn = ca.get_policy_loss_fn("cpgd")
    assert fn(old, new, adv, t([[1, 1, 1, 1]]))[3].item() == 0.0  # c = 3 by default
    lower = fn(old, new, adv, t([[1, 1, 1, 1]]), config={"clip_ratio_c": 2.0})[3]
    assert lower.item() == 0.5  # the two tokens with A < 0
    with pytest.raises(ConfigError, match="clip_ratio_c must be > 1.0"):
        fn(old, new, adv, t([[1, 1, 1, 1]]), config={"clip_ratio_c": 1.0})


def test_geo_mean_clip_fractions_split_by_the_advantage_sign():
    old = torch.zeros(1, 4, dtype=F64)
    new = torch.full((1, 4), 1.0, dtype=F64)  # log-ratio 1: clipped at 0.2 everywhere
    adv = t([[0.5, 0.0, -0.5, 2.0]])
    _, clipfrac, _, lower = ca.get_policy_loss_fn("geo_mean")(old, new, adv, t([[1, 1, 1, 1]]))
    assert clipfrac.item() == 0.5 and lower.item() == 0.25


# ---- group rules -----------------------------------------------------------------------------

def test_cpgd_clip_filter_like_weight_is_capped_at_three():
    # 8 rows in 4 groups of 2; only one group has a spread: weight min(8 / 1, 3) = 3
    scores = [1.0, 0.0] + [1.0, 1.0] * 3
    rewards, mask = outcome(scores)
    index = [0, 0, 1, 1, 2, 2, 3, 3]
    adv = ca.compute_cpgd_outcome_advantage(rewards, mask, index,
                                            weight_factor_in_cpgd="clip_filter_like_weight")[0]
    assert per_row(adv)[:2] == [1.5, -1.5] and per_row(adv)[2:] == [0.0] * 6


def test_opo_baseline_for_a_group_of_two_weighs_by_length():
    rewards, mask = outcome([1.0, 0.0], lengths=[3, 1])
    adv = ca.compute_opo_outcome_advantage(rewards, mask, ["g", "g"])[0]
    assert per_row(adv) == [pytest.approx(0.25), pytest.approx(-0.75)]  # baseline 3/4


def test_opo_baseline_of_a_one_token_group():
    rewards, mask = outcome([1.0, 0.0], lengths=[1, 0])
    adv = ca.compute_opo_outcome_advantage(rewards, mask, ["g", "g"])[0]
    # baseline = (1 * 1 + 0 * 0) / 1 = 1: the scored response gets 1 - 1 = 0
    assert adv[0, 0].item() == 0.0


def test_gpg_alpha_counts_the_nonzero_scores_even_when_only_one_is():
    rewards, mask = outcome([1.0, 0.0, 0.0, 0.0])
    adv = ca.compute_gpg_outcome_advantage(rewards, mask, ["a", "a", "b", "b"])[0]
    # alpha = 4 / 1; group a: mean 0.5
    assert per_row(adv) == [2.0, -2.0, 0.0, 0.0]


# ---- masked statistics, grouping -------------------------------------------------------------

def test_masked_mean_of_one_selected_entry_is_that_entry():
    values, mask = t([[3.0, 7.0], [5.0, 1.0]]), t([[0, 1], [0, 0]])
    assert ca.masked_mean(values, mask).item() == 7.0
    assert ca.masked_mean(values, mask, axis=-1).tolist() == [7.0, 0.0]


def test_masked_var_bessel_factor_needs_two_entries():
    values = t([[1.0, 3.0, 100.0]])
    assert ca.masked_var(values, t([[1, 0, 0]])).item() == 0.0  # one entry: no factor
    assert ca.masked_var(values, t([[1, 1, 0]])).item() == 2.0  # (1 + 1) / 2 * 2 / 1
    assert ca.masked_var(values, t([[1, 1, 0]]), unbiased=False).item() == 1.0


def test_masked_whiten_without_shifting_the_mean_keeps_it():
    values, mask = t([[1.0, 3.0]]), t([[1, 1]])
    shifted = ca.masked_whiten(values, mask)
    kept = ca.masked_whiten(values, mask, shift_mean=False)
    assert torch.allclose(kept, shifted + 2.0)


def test_a_row_with_one_token_is_not_empty_in_sequence_means():
    loss, mask = t([[2.0, 9.0], [4.0, 6.0]]), t([[1, 0], [1, 1]])
    assert ca.agg_loss(loss, mask, "seq-mean-token-sum").item() == (2.0 + 10.0) / 2
    assert ca.agg_loss(loss, mask, "seq-mean-token-mean").item() == (2.0 + 5.0) / 2
    assert ca.agg_loss_units(mask, "seq-mean-token-sum").item() == 2
    assert ca.agg_loss(loss, mask).item() == ca.agg_loss(loss, mask, "token-mean").item()


@pytest.mark.parametrize("index", [
    torch.tensor([7, 7, 8]), [torch.tensor(7), torch.tensor(7), torch.tensor(8)],
    __import__("numpy").array([7, 7, 8]),
])
def test_group_rows_reads_tensor_and_numpy_ids_by_value(index):
    assert ca.group_rows(index, 3) == {7: [0, 1], 8: [2]}


# ---- registering at run time -----------------------------------------------------------------

def test_estimators_losses_and_modes_registered_later_are_found():
    import enum

    from siirl.dag_worker.core_algos import advantages, loss_aggregation, policy_losses

    class Name(enum.Enum):
        MINE = "test_only_mine"

    def zero(token_level_rewards, response_mask):
        return response_mask * 0, response_mask * 0

    def loss(*args, **kwargs):
        return None

    def mode(loss_mat, mask):
        return loss_mat.sum()

    try:
        ca.register_adv_est(Name.MINE, "test_only_other")(zero)
        assert ca.get_adv_estimator_fn("test_only_mine") is zero
        assert ca.get_adv_estimator_fn("test_only_other") is zero
        ca.register_policy_loss("test_only_loss")(loss)
        assert ca.get_policy_loss_fn("test_only_loss") is loss
        ca.register_agg_mode("test_only_mode", units=lambda m: m.sum() * 0 + 3)(mode)
        assert ca.agg_loss(t([[1.0, 2.0]]), t([[1, 1]]), "test_only_mode").item() == 3.0
        assert ca.agg_loss_units(t([[1, 1]]), "test_only_mode").item() == 3
    finally:
        for registry, names in ((advantages._ADV_ESTIMATORS, ("test_only_mine",
                                                               "test_only_other")),
                                (policy_losses._POLICY_LOSSES, ("test_only_loss",)),
                                (loss_aggregation._AGG_MODES, ("test_only_mode",))):
            for name in names:
                registry._entries.pop(name, None)


# ---- the dual clip ---------------------------------------------------------------------------

def test_vanilla_dual_clip_bounds_negative_advantage_losses_at_clip_ratio_c():
    old = torch.zeros(1, 2, dtype=F64)
    new = torch.full((1, 2), math.log(3.5), dtype=F64)  # ratio 3.5, beyond c = 3
    adv = t([[-1.0, 0.0]])
    fn = ca.get_policy_loss_fn("vanilla")
    loss, _, _, lower = fn(old, new, adv, t([[1, 0]]))
    assert loss.item() == pytest.approx(3.0) and lower.item() == 1.0  # -A * c
    loss, _, _, _ = fn(old, new, adv, t([[1, 0]]), config={"clip_ratio_c": 1.5})
    assert loss.item() == pytest.approx(1.5)
    # a zero advantage has nothing to bound: its loss is 0 and it is not counted
    loss, _, _, lower = fn(old, new, adv, t([[0, 1]]))
    assert loss.item() == 0.0 and lower.item() == 0.0


def test_metrics_without_a_value_are_zeros_of_the_loss_dtype():
    old, new = torch.zeros(1, 2, dtype=F64), torch.zeros(1, 2, dtype=F64)
    out = ca.get_policy_loss_fn("gpg")(old, new, t([[1.0, 1.0]]), t([[1, 1]]))
    assert all(m.dtype == F64 and m.shape == () for m in out[1:])


# ---- more defaults and edges -----------------------------------------------------------------

@pytest.mark.parametrize("name", ["vanilla", "clip_cov", "kl_cov", "gspo"])
def test_the_aggregation_mode_changes_the_loss(name):  # (geo_mean: always per sequence)
    torch.manual_seed(0)
    old, new = torch.zeros(2, 3, dtype=F64), torch.randn(2, 3, dtype=F64) * 0.1
    adv = t([[1.0, 2.0, 3.0], [-1.0, 0.5, 0.5]])
    mask = t([[1, 1, 1], [1, 0, 0]])
    fn = ca.get_policy_loss_fn(name)
    torch.manual_seed(1)
    a = fn(old, new, adv, mask, "token-mean")[0]
    torch.manual_seed(1)
    b = fn(old, new, adv, mask, "seq-mean-token-sum")[0]
    assert not torch.isclose(a, b)


def test_an_extreme_log_ratio_is_clamped_to_20_so_the_ratio_stays_finite():
    old = torch.zeros(1, 2, dtype=F64)
    new = t([[50.0, -50.0]])
    out = ca.get_policy_loss_fn("vanilla")(old, new, t([[1.0, 1.0]]), t([[1, 0]]))
    assert out[2].item() == -20.0  # ppo_kl = mean(-clamped log-ratio)
    out = ca.get_policy_loss_fn("vanilla")(old, new, t([[1.0, 1.0]]), t([[0, 1]]))
    assert out[2].item() == 20.0


def test_truncated_importance_weights_are_floored_at_exp_minus_20():
    weights = ca.tis_weights(t([[0.0, 0.0, 0.0]]), t([[30.0, 0.5, -30.0]]), cap=2.0)
    assert weights[0, 0].item() == math.exp(-20.0)
    assert weights[0, 1].item() == pytest.approx(math.exp(-0.5)) and weights[0, 2] == 2.0


def test_vanilla_applies_tis_only_with_a_positive_cap_and_rollout_log_probs():
    old, new = torch.zeros(1, 1, dtype=F64), torch.zeros(1, 1, dtype=F64)
    adv, mask = t([[1.0]]), t([[1]])
    rollout = t([[1.0]])  # the weight is exp(0 - 1) = 0.37, below any cap here
    fn = ca.get_policy_loss_fn("vanilla")
    plain = fn(old, new, adv, mask)[0].item()
    assert plain == -1.0
    assert fn(old, new, adv, mask, rollout_log_probs=rollout)[0].item() == plain  # no cap
    for cap in (0, 0.0, -1.0):
        assert fn(old, new, adv, mask, config={"tis_imp_ratio_cap": cap},
                  rollout_log_probs=rollout)[0].item() == plain
    weighted = fn(old, new, adv, mask, config={"tis_imp_ratio_cap": 1.0},
                  rollout_log_probs=rollout)[0].item()
    assert weighted == pytest.approx(-math.exp(-1.0))


def test_gspo_caps_the_sequence_ratio_and_clips_it_from_both_sides():
    fn = ca.get_policy_loss_fn("gspo")
    old = torch.zeros(1, 1, dtype=F64)
    # one token, log-ratio 12: the ratio is capped at e^10; with A < 0 the unclipped wins
    loss = fn(old, t([[12.0]]), t([[-1.0]]), t([[1]]))[0]
    assert loss.item() == pytest.approx(math.exp(10.0))
    # ratio 0.5 with A < 0: the ratio clipped up to 0.8 is the larger loss
    loss = fn(old, t([[math.log(0.5)]]), t([[-1.0]]), t([[1]]))[0]
    assert loss.item() == pytest.approx(0.8)
    # a one-token sequence's ratio is that token's own
    loss = fn(torch.zeros(1, 2, dtype=F64), t([[0.1, 5.0]]), t([[1.0, 1.0]]), t([[1, 0]]))[0]
    assert loss.item() == pytest.approx(-math.exp(0.1))


def test_a_ratio_exactly_on_a_clip_bound_is_not_clipped():
    old = torch.zeros(1, 2, dtype=F64)
    new = torch.zeros(1, 2, dtype=F64)  # ratio exactly 1
    adv = t([[1.0, -1.0]])
    out = ca.get_policy_loss_fn("cpgd")(old, new, adv, t([[1, 1]]), config={"clip_ratio": 0.0})
    assert out[1].item() == 0.0  # bounds 1 and 1, ratio 1: neither side is crossed
    new = torch.full((1, 2), math.log(2.0), dtype=F64)  # exactly 2
    out = ca.get_policy_loss_fn("cpgd")(old, new, adv, t([[1, 1]]), config={"clip_ratio_c": 2.0})
    assert out[3].item() == 0.0


KL_GAPS = t([[0.5, 0.1, 0.2]])  # |log_prob - old_log_prob| per token


def _kl_cov_case():
    # 3 tokens; centred A = [1, 0, -1], centred log_prob = [7/3, -2/3, -5/3]: covariances
    # A * logp = [7/3, 0, 5/3], so token 0 has the largest (a ratio A / logp would pick 2)
    new = t([[3.0, 0.0, -1.0]])
    return new - KL_GAPS, new, t([[1.0, 0.0, -1.0]]), t([[1, 1, 1]])


def test_kl_cov_penalises_the_one_token_of_largest_covariance_by_default():
    old, new, adv, mask = _kl_cov_case()
    loss, _, kl_abs, _ = ca.get_policy_loss_fn("kl_cov")(old, new, adv, mask)
    base = (-adv * torch.exp(KL_GAPS)).sum().item()
    assert kl_abs.item() == pytest.approx(KL_GAPS.mean().item())
    assert loss.item() == pytest.approx((base + 0.1 * 0.5) / 3)  # ppo_kl_coef 0.1, token 0
    two = ca.get_policy_loss_fn("kl_cov")(old, new, adv, mask,
                                         config={"policy_loss": {"kl_cov_ratio": 0.7}})[0]
    assert two.item() == pytest.approx((base + 0.1 * (0.5 + 0.2)) / 3)  # int(3 * 0.7) = 2


def test_kl_cov_with_one_or_no_valid_token():
    old, new, adv, _ = _kl_cov_case()
    one = ca.get_policy_loss_fn("kl_cov")(old, new, adv, t([[1, 0, 0]]))[0]
    assert one.item() == pytest.approx(-math.exp(0.5) + 0.1 * 0.5)
    none = ca.get_policy_loss_fn("kl_cov")(old, new, adv, t([[0, 0, 0]]))[0]
    assert none.item() == 0.0


def test_clip_cov_detaches_one_token_with_covariance_inside_the_default_bounds():
    # log_prob centred: [1, 1, -1, -1] (mean 0); advantages centred by construction
    new = t([[1.0, 1.0, -1.0, -1.0]])
    old = new.clone()  # ratio 1: nothing is clipped by the ratio
    adv = t([[1.5, 5.5, 0.0, -7.0]])  # mean 0: covariances 1.5, 5.5, 0, 7
    mask = t([[1, 1, 1, 1]])
    torch.manual_seed(0)
    loss, clipfrac, _, _ = ca.get_policy_loss_fn("clip_cov")(old, new, adv, mask)
    assert clipfrac.item() == 0.25  # only the 1.5 token is in (1, 5)
    assert loss.item() == pytest.approx(-(5.5 + 0.0 - 7.0) / 4)
    # bounds are exclusive: covariances of exactly 1 and 5 are not candidates
    adv = t([[1.0, 5.0, 0.0, -6.0]])
    assert ca.get_policy_loss_fn("clip_cov")(old, new, adv, mask)[1].item() == 0.0


def test_clip_cov_detaches_at_most_its_share_and_centres_the_log_probs():
    # log-probs shifted by +2 (ratio still 1): the covariance uses them centred
    new = t([[3.0, 3.0, 1.0, 1.0]])
    adv = t([[1.5, 2.0, 0.0, -3.5]])  # covariances 1.5, 2, 0, 3.5: three candidates
    torch.manual_seed(0)
    out = ca.get_policy_loss_fn("clip_cov")(new.clone(), new, adv, t([[1, 1, 1, 1]]))
    assert out[1].item() == 0.25  # max(int(0.0002 * 4), 1) = 1 token detached


def test_clip_cov_never_detaches_a_token_the_ratio_already_clipped():
    # token 0: A = 1.5 > 0 and ratio 2 > 1.2, so the clipped loss is taken; its
    # covariance (1.5) would make it the only candidate
    old = torch.zeros(1, 4, dtype=F64)
    new = t([[math.log(2.0), math.log(2.0), -math.log(2.0), -math.log(2.0)]])
    centred = new - new.mean()
    adv = t([[1.5, 0.0, 0.0, -1.5]]) / centred.abs().max() * 1.0
    out = ca.get_policy_loss_fn("clip_cov")(old, new, adv, t([[1, 1, 1, 1]]))
    assert out[1].item() == 0.0


def test_clip_cov_draws_from_the_global_rng_even_for_one_candidate():
    new = t([[1.0, 1.0, -1.0, -1.0]])
    adv = t([[1.5, 5.5, 0.0, -7.0]])
    torch.manual_seed(3)
    ca.get_policy_loss_fn("clip_cov")(new.clone(), new, adv, t([[1, 1, 1, 1]]))
    after = torch.rand(1)
    torch.manual_seed(3)
    torch.randperm(1)
    assert torch.equal(after, torch.rand(1))


def test_clip_cov_uses_the_configured_clip_ratio():
    old = torch.zeros(1, 1, dtype=F64)
    new = t([[math.log(1.4)]])
    fn = ca.get_policy_loss_fn("clip_cov")
    assert fn(old, new, t([[1.0]]), t([[1]]))[0].item() == pytest.approx(-1.2)
    assert fn(old, new, t([[1.0]]), t([[1]]),
              config={"clip_ratio": 0.5})[0].item() == pytest.approx(-1.4)


def test_adaptive_controller_defaults_and_a_horizon_of_one():
    ctrl = ca.get_kl_controller({"type": "adaptive"})
    assert (ctrl.target, ctrl.horizon) == (0.1, 10000)
    ca.AdaptiveKLController(0.1, 0.1, horizon=1)


def test_grpo_normalises_by_the_std_by_default_and_passk_takes_groups_of_two():
    rewards, mask = outcome([1.0, 0.0, 1.0, 1.0])
    index = ["a", "a", "b", "b"]
    assert torch.equal(ca.compute_grpo_outcome_advantage(rewards, mask, index)[0],
                       ca.compute_grpo_outcome_advantage(rewards, mask, index,
                                                         norm_adv_by_std_in_grpo=True)[0])
    passk = ca.compute_grpo_passk_outcome_advantage(rewards, mask, index)[0]
    assert torch.equal(passk, ca.compute_grpo_passk_outcome_advantage(
        rewards, mask, index, norm_adv_by_std_in_grpo=True)[0])
    std = math.sqrt(0.5)
    assert per_row(passk) == [pytest.approx(1.0 / (std + 1e-6)), 0.0, 0.0, 0.0]


def test_rloo_on_a_group_of_two_is_the_difference_of_the_scores():
    rewards, mask = outcome([3.0, 1.0])
    assert per_row(ca.compute_rloo_outcome_advantage(rewards, mask, ["g", "g"])[0]) == \
        [2.0, -2.0]


def test_marft_gae_refuses_more_value_or_mask_parts_than_reward_parts():
    fn = ca.get_adv_estimator_fn("gae_marft")
    r0, v0, m0 = torch.zeros(2, 3, dtype=F64), torch.zeros(2, 3, dtype=F64), torch.ones(2, 3)
    v1, m1 = torch.zeros(2, 2, dtype=F64), torch.ones(2, 2)
    with pytest.raises(ValueError):
        fn([r0], [v0, v1], [m0, m1], 1.0, 1.0)
