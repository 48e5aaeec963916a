"""Tests for specdec.exactness.stats: calibration under H0, power against planted biases, interval coverage,
power-analysis consistency. Every random quantity comes from a fixed seed, so the suite is deterministic.

Calibration tolerance: over R repetitions at level α the number of rejections of a calibrated test is
Binomial(R, α); we accept any count inside its two-sided 99.9% interval (for R = 200, α = 0.05: 2..22).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats as sps

from specdec.exactness import stats

V = 1000


# ---------------------------------------------------------------------------------------------------
# Fixtures: LM-like conditionals, sampling, planted biases
# ---------------------------------------------------------------------------------------------------


def random_conditionals(n: int, rng: np.random.Generator, v: int = V) -> np.ndarray:  # -> [n, v]
    """Rows of varied shape: support of 50..v tokens (the rest p = 0), and either Gaussian logits at a
    scale between 0.5 and 8 (flat to peaked) or a Zipf law with exponent 0.7..2, on shuffled token ids.
    Median top-1 probability ≈ 0.27, median entropy ≈ 3 nats: roughly a small chat model's."""
    support = np.exp(rng.uniform(np.log(50), np.log(v), n)).astype(int)
    zipf = rng.random(n) < 0.5
    scale = np.exp(rng.uniform(np.log(0.5), np.log(8.0), n))
    exponent = rng.uniform(0.7, 2.0, n)
    ranks = np.arange(1, v + 1)[None, :]
    gauss = scale[:, None] * rng.standard_normal((n, v))
    logits = np.where(zipf[:, None], -exponent[:, None] * np.log(ranks), gauss)
    logits = np.where(np.arange(v)[None, :] < support[:, None], logits, -np.inf)
    logits = np.take_along_axis(logits, np.argsort(rng.random((n, v)), axis=1), axis=1)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def sample_rows(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:  # [n, v] -> [n]
    cdf = np.cumsum(p, axis=1)
    u = rng.random(p.shape[0]) * cdf[:, -1]
    return np.minimum((cdf < u[:, None]).sum(axis=1), p.shape[1] - 1)


def wrong_temperature(p: np.ndarray, t: float = 0.8) -> np.ndarray:
    q = p ** (1.0 / t)
    return q / q.sum(axis=1, keepdims=True)


def wrong_top_p(p: np.ndarray, top: float = 0.9) -> np.ndarray:
    order = np.argsort(-p, axis=1, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=1)
    keep_sorted = np.cumsum(sorted_p, axis=1) - sorted_p < top
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=1)
    q = np.where(keep, p, 0.0)
    return q / q.sum(axis=1, keepdims=True)


def argmax_mixed(p: np.ndarray, eps: float = 0.1) -> np.ndarray:
    q = (1.0 - eps) * p
    q[np.arange(p.shape[0]), p.argmax(axis=1)] += eps
    return q


def uniform_mixed(p: np.ndarray, eps: float = 0.1) -> np.ndarray:
    """Uniform over each row's support, so no token is impossible (that would be too easy to catch)."""
    support = (p > 0).astype(float)
    return (1.0 - eps) * p + eps * support / support.sum(axis=1, keepdims=True)


def binomial_999(reps: int, rate: float) -> tuple[int, int]:
    """Two-sided 99.9% interval for the number of rejections of a level-`rate` test in `reps` runs."""
    return int(sps.binom.ppf(0.0005, reps, rate)), int(sps.binom.isf(0.0005, reps, rate))


@pytest.fixture(scope="module")
def bank() -> np.ndarray:  # [3000, V] conditionals that the H0 repetitions draw rows from
    return random_conditionals(3000, np.random.default_rng(7))


# ---------------------------------------------------------------------------------------------------
# PIT and surprisal: unit behaviour
# ---------------------------------------------------------------------------------------------------


def test_pit_values_by_descending_probability_and_by_id():
    probs = np.array([[0.2, 0.5, 0.3], [0.25, 0.5, 0.25], [0.25, 0.5, 0.25]])
    tokens = np.array([2, 0, 2])
    u = stats.pit_values(probs, tokens, rng=0)
    # descending: token 2 (0.3) comes after token 1 (0.5); equal 0.25s are ordered by id
    assert 0.5 <= u[0] <= 0.8 and 0.5 <= u[1] <= 0.75 and 0.75 <= u[2] <= 1.0
    u_id = stats.pit_values(probs, tokens, rng=0, order="id")
    assert 0.7 <= u_id[0] <= 1.0 and 0.0 <= u_id[1] <= 0.25 and 0.75 <= u_id[2] <= 1.0
    np.testing.assert_array_equal(u, stats.pit_values(probs, tokens, rng=0))  # seeded


def test_pit_accepts_torch_tensors_and_generators():
    torch = pytest.importorskip("torch")
    probs = torch.softmax(torch.randn(64, 50, generator=torch.Generator().manual_seed(0)), dim=-1)
    tokens = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(1)).squeeze(1)
    u1 = stats.pit_values(probs, tokens, rng=torch.Generator().manual_seed(2))
    u2 = stats.pit_values(probs.numpy(), tokens.numpy(), rng=torch.Generator().manual_seed(2))
    np.testing.assert_allclose(u1, u2)
    assert stats.exactness_test(probs, tokens, rng=3).n == 64


def test_bad_inputs_are_rejected_with_a_reason():
    probs = np.full((4, 5), 0.2)
    with pytest.raises(ValueError, match=r"tokens must be \[N\]"):
        stats.pit_values(probs, np.zeros(3, dtype=int), rng=0)
    with pytest.raises(ValueError, match="token ids must lie"):
        stats.pit_values(probs, np.array([0, 1, 2, 5]), rng=0)
    with pytest.raises(ValueError, match="not logits"):
        stats.surprisal_test(np.full((4, 5), 3.0), np.zeros(4, dtype=int))
    with pytest.raises(ValueError, match="order"):
        stats.pit_values(probs, np.zeros(4, dtype=int), rng=0, order="ascending")
    with pytest.raises(TypeError, match="rng"):
        stats.pit_values(probs, np.zeros(4, dtype=int), rng=0.5)


def test_impossible_token_is_an_immediate_rejection():
    probs = np.array([[1.0, 0.0, 0.0]] * 10)  # greedy rows: one-hot on token 0
    assert stats.surprisal_test(probs, np.zeros(10, dtype=int)).p_value == 1.0
    tokens = np.zeros(10, dtype=int)
    tokens[3] = 1
    verdict = stats.exactness_test(probs, tokens, rng=0)
    assert verdict.reject and verdict.p_value == 0.0


# ---------------------------------------------------------------------------------------------------
# H0 calibration
# ---------------------------------------------------------------------------------------------------


def test_pit_and_surprisal_are_calibrated_under_h0(bank):
    reps, n_rows, alpha = 200, 300, 0.05
    rng = np.random.default_rng(11)
    pvals = {"pit_ks": [], "pit_chi2": [], "surprisal": [], "exactness": []}
    for _ in range(reps):
        probs = bank[rng.choice(len(bank), n_rows, replace=False)]
        tokens = sample_rows(probs, rng)
        u = stats.pit_values(probs, tokens, rng=rng)
        pvals["pit_ks"].append(stats.uniformity_ks(u).p_value)
        pvals["pit_chi2"].append(stats.uniformity_chi2(u).p_value)
        pvals["surprisal"].append(stats.surprisal_test(probs, tokens).p_value)
        pvals["exactness"].append(stats.exactness_test(probs, tokens, rng=rng, alpha=alpha).p_value)
    lo, hi = binomial_999(reps, alpha)
    for name, p in pvals.items():
        rejections = int((np.array(p) <= alpha).sum())
        if name == "exactness":  # Bonferroni is conservative: only the upper bound is promised
            assert rejections <= hi, (name, rejections)
        else:
            assert lo <= rejections <= hi, (name, rejections)
            assert sps.kstest(p, "uniform").pvalue > 0.001, name  # the p-values themselves ~ U(0, 1)


def test_per_position_tests_with_holm_keep_the_family_wise_rate(bank):
    reps, positions, rows_per_position, alpha = 200, 10, 40, 0.05
    rng = np.random.default_rng(12)
    any_rejected = 0
    for _ in range(reps):
        probs = bank[rng.choice(len(bank), positions * rows_per_position, replace=False)]
        u = stats.pit_values(probs, sample_rows(probs, rng), rng=rng).reshape(positions, rows_per_position)
        pvals = [stats.uniformity_ks(row).p_value for row in u]
        any_rejected += bool(stats.holm(pvals, alpha)[1].any())
    # independent nulls: Holm's family-wise rate is exactly 1 − (1 − α/m)^m ≈ 0.049
    lo, hi = binomial_999(reps, 1 - (1 - alpha / positions) ** positions)
    assert lo <= any_rejected <= hi


def test_two_sample_tests_are_calibrated_under_h0():
    reps, alpha, k = 200, 0.05, 200
    rng = np.random.default_rng(13)
    zipf = np.arange(1, k + 1) ** -1.1
    zipf /= zipf.sum()
    rejections = {"chi2": 0, "g": 0}
    for _ in range(reps):
        a, b = rng.choice(k, 300, p=zipf), rng.choice(k, 500, p=zipf)  # unequal sizes, many rare cells
        rejections["chi2"] += stats.chi2_two_sample(a, b, alpha=alpha).reject
        rejections["g"] += stats.g_two_sample(a, b, alpha=alpha).reject
    lo, hi = binomial_999(reps, alpha)
    for name, r in rejections.items():
        assert lo <= r <= hi, (name, r)


# ---------------------------------------------------------------------------------------------------
# Power against planted biases (α = 0.01)
# ---------------------------------------------------------------------------------------------------

# bias, rows N: the smallest round N at which ≥ 0.9 of seeds reject in our measurements, doubled for
# margin where that stays ≤ 2000 (argmax mixing is the hardest: TV ≈ 0.066 per row, ~0.98 at N = 1600)
PLANTED = [
    pytest.param(wrong_temperature, 400, id="temperature-0.8"),
    pytest.param(wrong_top_p, 800, id="top-p-0.9"),
    pytest.param(argmax_mixed, 2000, id="argmax-10pct"),
    pytest.param(uniform_mixed, 400, id="uniform-10pct"),
]


@pytest.mark.parametrize("bias, n_rows", PLANTED)
def test_exactness_test_catches_planted_bias(bias, n_rows):
    def run(seed: int) -> stats.Verdict:
        rng = np.random.default_rng(seed)
        probs = random_conditionals(n_rows, rng)
        return stats.exactness_test(probs, sample_rows(bias(probs), rng), rng=rng, alpha=0.01)

    assert run(0).reject
    rate = np.mean([run(seed).reject for seed in range(100, 120)])
    assert rate >= 0.9, rate


def test_bias_at_one_position_is_caught_by_the_per_position_tests():
    """A bonus-token-style bug: only the last of 5 positions is sampled too cold."""
    rng = np.random.default_rng(21)
    probs = random_conditionals(1500, rng)
    positions = np.arange(1500) % 5
    target = np.where((positions == 4)[:, None], wrong_temperature(probs), probs)
    verdict = stats.exactness_test(probs, sample_rows(target, rng), rng=rng, positions=positions, alpha=0.01)
    assert verdict.reject and len(verdict.parts) == 12
    worst = min(verdict.parts, key=lambda v: v.p_value)
    assert worst.name.endswith("[position=4]")


def test_descending_order_has_power_that_id_order_lacks():
    rng = np.random.default_rng(22)
    probs = random_conditionals(400, rng)
    tokens = sample_rows(wrong_temperature(probs), rng)
    assert stats.pit_test(probs, tokens, rng=1, alpha=0.01).reject
    assert not stats.pit_test(probs, tokens, rng=1, alpha=0.01, order="id").reject


def test_two_sample_tests_detect_a_shift_and_take_tuples_and_strings():
    rng = np.random.default_rng(23)
    p = random_conditionals(1, rng, v=50)
    q = wrong_temperature(p)
    a = rng.choice(50, (2000, 2), p=p[0])  # [n, L] continuations of length 2 -> tuples
    b = rng.choice(50, (2000, 2), p=q[0])
    assert stats.chi2_two_sample(a, b, alpha=0.01).reject and stats.g_two_sample(a, b, alpha=0.01).reject
    same = stats.chi2_two_sample(["ab", "cd"] * 50, ["cd", "ab"] * 60)
    assert same.dof == 1 and same.p_value > 0.5


# ---------------------------------------------------------------------------------------------------
# Contingency tables: agreement with scipy, pooling
# ---------------------------------------------------------------------------------------------------


def test_homogeneity_matches_scipy_without_pooling():
    table = np.array([[30, 45, 25, 50], [40, 35, 30, 45]])
    ours = stats.homogeneity_test(table)
    ref = sps.chi2_contingency(table, correction=False)
    assert ours.dof == ref.dof and ours.statistic == pytest.approx(ref.statistic)
    assert ours.p_value == pytest.approx(ref.pvalue)
    g_ref = sps.chi2_contingency(table, correction=False, lambda_="log-likelihood")
    g = stats.homogeneity_test(table, statistic="g")
    assert g.statistic == pytest.approx(g_ref.statistic, rel=0.01)  # Williams' q ≈ 1.004 here
    assert g.statistic < g_ref.statistic


def test_small_cells_are_pooled_into_other():
    table = np.array([[50, 40, 3, 2, 2, 1], [55, 35, 2, 3, 1, 2]])
    assert stats.homogeneity_test(table).dof == 2  # 4 rare columns -> one "other" (expected 8 per row)
    table = np.array([[50, 40, 2, 1, 1, 0], [55, 35, 1, 2, 0, 1]])
    assert stats.homogeneity_test(table).dof == 1  # "other" expects 4 < 5: merged into the 75 column
    assert stats.homogeneity_test(np.array([[1, 2, 1], [2, 1, 1]])).dof == 0  # nothing left to test


def test_goodness_of_fit_matches_scipy_and_flags_impossible_categories():
    rng = np.random.default_rng(24)
    p = np.array([0.4, 0.3, 0.2, 0.1])
    sample = rng.choice(4, 500, p=p)
    ours = stats.chi2_goodness_of_fit(sample, p)
    ref = sps.chisquare(np.bincount(sample, minlength=4), 500 * p)
    assert ours.p_value == pytest.approx(ref.pvalue) and ours.dof == 3
    assert stats.chi2_goodness_of_fit(np.array([0, 1, 4]), [0.5, 0.5, 0, 0, 0]).p_value == 0.0


# ---------------------------------------------------------------------------------------------------
# TV intervals
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shifted", [True, False], ids=["tv-0.1", "tv-0"])
def test_tv_intervals_cover_the_true_distance(shifted):
    rng = np.random.default_rng(25)
    p = np.array([0.3, 0.25, 0.2, 0.1, 0.1, 0.05])
    q = np.array([0.2, 0.25, 0.2, 0.15, 0.1, 0.1]) if shifted else p
    true_tv = 0.5 * np.abs(p - q).sum()
    covered_one, covered_two = 0, 0
    for _ in range(200):
        x, y = rng.choice(6, 300, p=q), rng.choice(6, 400, p=p)
        est, lo, hi = stats.tv_to_distribution(x, p, confidence=0.95)
        covered_one += lo <= true_tv <= hi and lo <= est <= hi
        est, lo, hi = stats.tv_two_sample(x, y, confidence=0.95, num_categories=6)
        covered_two += lo <= true_tv <= hi and lo <= est <= hi
    assert covered_one >= 0.95 * 200 and covered_two >= 0.95 * 200


def test_tv_estimate_is_the_plug_in_distance():
    est, lo, hi = stats.tv_to_distribution(np.array([0, 0, 0, 1]), [0.5, 0.5])
    assert est == pytest.approx(0.25) and lo == 0.0 and hi == 1.0
    assert stats.tv_two_sample(["a"] * 10, ["b"] * 10)[0] == 1.0


# ---------------------------------------------------------------------------------------------------
# Power analysis
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 10, 100])
def test_samples_needed_and_detectable_tv_are_inverse_and_monotone(k):
    for delta in (0.01, 0.05, 0.2):
        n = stats.samples_needed(delta, 0.01, 0.9, num_categories=k)
        assert stats.detectable_tv(n, 0.01, 0.9, num_categories=k) <= delta
        assert n == 1 or stats.detectable_tv(n - 1, 0.01, 0.9, num_categories=k) > delta
    for n in (100, 1000, 10_000):
        assert stats.samples_needed(stats.detectable_tv(n, num_categories=k), num_categories=k) <= n
    ns = [stats.samples_needed(d, num_categories=k) for d in (0.02, 0.05, 0.1, 0.3)]
    assert ns == sorted(ns, reverse=True)
    assert stats.samples_needed(0.05, 0.01, num_categories=k) > stats.samples_needed(0.05, 0.05, num_categories=k)
    assert stats.samples_needed(0.05, power=0.9, num_categories=k) > stats.samples_needed(0.05, num_categories=k)
    tvs = [stats.detectable_tv(n, num_categories=k) for n in (10, 100, 1000)]
    assert tvs == sorted(tvs, reverse=True)


def test_samples_needed_gives_the_claimed_power_in_simulation():
    k, delta, alpha, power = 10, 0.1, 0.05, 0.8
    n = stats.samples_needed(delta, alpha, power, num_categories=k)
    p = np.full(k, 1 / k)
    q = p * (1 + 2 * delta * np.where(np.arange(k) % 2 == 0, 1, -1))  # worst case: w = 2·TV exactly
    assert 0.5 * np.abs(q - p).sum() == pytest.approx(delta)
    rng = np.random.default_rng(26)
    reps = 1000
    rejected = sum(stats.chi2_goodness_of_fit(rng.choice(k, n, p=q), p, alpha=alpha).reject for _ in range(reps))
    lo, hi = binomial_999(reps, power)
    assert lo - 10 <= rejected <= hi + 10, (n, rejected)  # ±1 point for the noncentral approximation


def test_power_arguments_are_validated():
    with pytest.raises(ValueError, match="delta"):
        stats.samples_needed(0.0, num_categories=10)
    with pytest.raises(ValueError, match="power"):
        stats.samples_needed(0.1, 0.05, 0.01, num_categories=10)
    with pytest.raises(ValueError, match="num_categories"):
        stats.detectable_tv(100, num_categories=1)


# ---------------------------------------------------------------------------------------------------
# A rate with known conditional probabilities (the draft-match test)
# ---------------------------------------------------------------------------------------------------


def test_hit_rate_test_is_calibrated_and_has_the_claimed_power():
    """Under H0 (each hit Bernoulli(π_i)), 400 repetitions at α = 0.05 reject inside Binomial's 99.9%
    interval; shifted by the detectable shift at power 0.8, about 80% reject."""
    rng = np.random.default_rng(31)
    reps, n, alpha = 400, 500, 0.05
    probs = rng.beta(0.5, 1.5, size=(reps, n))  # skewed toward small probabilities, like p(draft)
    null = sum(stats.hit_rate_test(rng.random(n) < p, p, alpha=alpha).reject for p in probs)
    lo, hi = binomial_999(reps, alpha)
    assert lo <= null <= hi, null
    variance = float((probs * (1 - probs)).mean())
    delta = stats.hit_rate_detectable_shift(n, variance, alpha, 0.8)
    shifted = sum(stats.hit_rate_test(rng.random(n) < np.minimum(p + delta, 1), p, alpha=alpha).reject for p in probs)
    lo, hi = binomial_999(reps, 0.8)
    assert lo - 20 <= shifted <= hi + 20, (delta, shifted)  # ±5 points: clipping at 1 and the normal approximation


def test_hit_rate_power_figures_are_inverse_and_validated():
    for delta in (0.01, 0.05, 0.2):
        n = stats.hit_rate_samples_needed(delta, 0.2, 0.001, 0.9)
        assert stats.hit_rate_detectable_shift(n, 0.2, 0.001, 0.9) <= delta
        assert n == 1 or stats.hit_rate_detectable_shift(n - 1, 0.2, 0.001, 0.9) > delta
    assert stats.hit_rate_test([True, False], [1.0, 0.0]).p_value == 1.0  # degenerate: every outcome certain
    assert stats.hit_rate_test([False, False], [1.0, 0.0]).p_value == 0.0
    assert stats.hit_rate_test([1, 1, 1, 1], [0.2] * 4).statistic > 0  # more hits than expected: z > 0
    with pytest.raises(ValueError, match="both be"):
        stats.hit_rate_test([True], [0.5, 0.5])
    with pytest.raises(ValueError, match="mean_variance"):
        stats.hit_rate_samples_needed(0.1, 0.3)
    with pytest.raises(ValueError, match="power"):
        stats.hit_rate_detectable_shift(100, 0.2, 0.05, 0.01)


# ---------------------------------------------------------------------------------------------------
# Multiple testing and the Verdict record
# ---------------------------------------------------------------------------------------------------


def test_holm_and_bonferroni():
    p = [0.01, 0.04, 0.03, 0.005]
    adj, rej = stats.holm(p, 0.05)
    np.testing.assert_allclose(adj, [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_array_equal(rej, [True, False, False, True])
    adj_b, rej_b = stats.bonferroni(p, 0.05)
    np.testing.assert_allclose(adj_b, [0.04, 0.16, 0.12, 0.02])
    assert (adj <= adj_b).all() and rej.sum() >= rej_b.sum()
    with pytest.raises(ValueError, match="p-values"):
        stats.holm([0.5, 1.5])


def test_verdict_to_dict_is_json_ready():
    probs = np.array([[1.0, 0.0]] * 4)
    verdict = stats.exactness_test(probs, np.array([0, 0, 1, 0]), rng=0)
    record = json.loads(json.dumps(verdict.to_dict()))
    assert record["name"] == "exactness" and record["reject"] is True
    assert [part["name"] for part in record["parts"]] == ["pit_ks[pooled]", "surprisal[pooled]"]
    assert record["parts"][1]["statistic"] == "inf" and math.isinf(verdict.parts[1].statistic)
