"""Statistical tests with stated error rates, for proving that speculative sampling is exact.

The hypothesis under test
-------------------------
A speculative decoder emits tokens x_1..x_N (over many prompts and positions). For each emitted token we
also know the target's *exact* conditional p_i = p(· | emitted prefix) from the target's own forward pass
on that prefix. Exactness (H0) says: given the emitted prefix, x_i is a draw from p_i. Nothing else about
the decoder (drafts, accepted lengths, whether x_i was a recovered or bonus token) may matter.

Why rows can be pooled: the randomised PIT below turns each token into u_i with u_i | (everything
emitted before it) ~ Uniform(0, 1) under H0, whatever the prefix. So u_1..u_N are i.i.d. Uniform(0, 1)
(the Rosenblatt transform), even though the p_i differ per row and the rows of one continuation are
dependent. The same martingale argument makes the surprisal sum below a sum of independent-increment
terms with known conditional mean and variance.

Tests and their error rates (α = the level you pass; every test returns a :class:`Verdict`)
-------------------------------------------------------------------------------------------
- :func:`pit_values` / :func:`pit_test`: randomised PIT, then a Kolmogorov–Smirnov test of uniformity
  (exact finite-sample null distribution for small N, asymptotic for large) or a chi-square test on
  equal-width bins (asymptotic; bins keep ≥ 5 expected rows). Pooled over all rows, and per position.
- :func:`surprisal_test`: z = Σ(−log p_i(x_i) − H(p_i)) / sqrt(Σ Var_i), two-sided normal p-value
  (central limit theorem; calibrated in the tests for N ≥ 100 rows of LM-like distributions).
- :func:`exactness_test`: the PIT KS test and the surprisal test (pooled, and per position if positions
  are given), combined by Bonferroni: the family-wise false-rejection rate is ≤ α under H0, with no
  assumption about how the tests depend on each other. :func:`token_scores` reduces (probs, tokens) to
  four numbers per token and :func:`exactness_test_from_scores` runs the same test on them, so a long
  run over a large vocabulary is scored in chunks without holding [N, V] (``exactness_test`` is built
  on the pair).
- :func:`chi2_two_sample` / :func:`g_two_sample`: homogeneity of two samples of discrete outcomes
  (e.g. whole continuations as tuples), asymptotic chi-square with small-cell pooling.
- :func:`chi2_goodness_of_fit`: one sample against a known distribution, same pooling.
- :func:`tv_to_distribution` / :func:`tv_two_sample`: total-variation estimates with intervals whose
  coverage is guaranteed ≥ the stated confidence for every distribution (conservative; finite sample).
- :func:`samples_needed` / :func:`detectable_tv`: power of the chi-square goodness-of-fit test against a
  worst-case alternative at a given TV distance ("the smallest bias this run could have detected").
- :func:`hit_rate_test`: two-sided z-test that indicators (e.g. "the emitted token is the draft token")
  occur at the rate their known conditional probabilities predict (martingale CLT); with
  :func:`hit_rate_detectable_shift` / :func:`hit_rate_samples_needed`, its power against a shift of that rate.
- :func:`holm` / :func:`bonferroni`: family-wise error control over a list of p-values.

Which PIT ordering, and why
---------------------------
The PIT needs a fixed order of the vocabulary per row. By token id, a bias that moves mass between likely
and unlikely tokens lands at unrelated places in [0, 1] for different rows and averages out when pooled:
the test has almost no power. By *descending probability* (ties broken by token id), u near 0 always
means "one of the most likely tokens" and u near 1 "the tail". Then too-peaked sampling (temperature
below the target's, top-p/top-k truncation that should not be there, argmax mixed in) piles u toward 0,
and too-flat sampling (temperature above, uniform noise, mass leaking to wrong tokens) toward 1. That is
the default. The surprisal test complements it: it weighs each token by its log-improbability, so a
small amount of mass leaking into very unlikely tokens (which KS sees only as the mass moved) shows up
strongly, and it needs no ordering at all.

Tokens with p_i(x_i) = 0 are impossible under H0: the surprisal test then returns p-value 0.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
from scipy import optimize, stats

__all__ = [
    "Verdict",
    "pit_values",
    "uniformity_ks",
    "uniformity_chi2",
    "pit_test",
    "surprisal_test",
    "surprisal_test_from_scores",
    "exactness_test",
    "TokenScores",
    "token_scores",
    "pit_from_scores",
    "exactness_test_from_scores",
    "homogeneity_test",
    "chi2_two_sample",
    "g_two_sample",
    "chi2_goodness_of_fit",
    "tv_to_distribution",
    "tv_two_sample",
    "samples_needed",
    "detectable_tv",
    "hit_rate_test",
    "hit_rate_detectable_shift",
    "hit_rate_samples_needed",
    "holm",
    "bonferroni",
]

PitOrder = Literal["descending", "id"]
_ROW_CHUNK_ELEMENTS = 1 << 22  # rows are processed in blocks of ~4M probabilities to bound memory


@dataclass(frozen=True)
class Verdict:
    """One test's outcome. ``reject`` is ``p_value <= alpha``; ``parts`` holds the tests a combined
    verdict was built from (each at its own, already corrected, level)."""

    name: str
    statistic: float
    p_value: float
    alpha: float
    reject: bool
    dof: float | None = None
    n: int | None = None
    parts: tuple[Verdict, ...] = field(default=())

    @classmethod
    def from_p(cls, name: str, statistic: float, p_value: float, alpha: float, **kw: Any) -> Verdict:
        p_value = float(min(1.0, max(0.0, p_value)))
        return cls(name, float(statistic), p_value, float(alpha), p_value <= alpha, **kw)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (non-finite statistics become strings, which JSON allows)."""
        out = asdict(self)
        out["parts"] = [p.to_dict() for p in self.parts]
        if not math.isfinite(out["statistic"]):
            out["statistic"] = str(out["statistic"])
        return out


# ---------------------------------------------------------------------------------------------------
# Input handling
# ---------------------------------------------------------------------------------------------------


def _to_numpy(x: Any, dtype: Any = None) -> np.ndarray:
    """numpy view of an array-like or a torch tensor (torch is only touched if already imported)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        x = x.double().numpy() if x.is_floating_point() else x.numpy()
    return np.asarray(x, dtype=dtype)


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")


def _probs_and_tokens(probs: Any, tokens: Any) -> tuple[np.ndarray, np.ndarray]:
    probs = _to_numpy(probs)
    tokens = _to_numpy(tokens)
    if probs.ndim != 2:
        raise ValueError(f"probs must be [N, V] (one target conditional per emitted token), got {probs.shape}")
    if tokens.shape != (probs.shape[0],):
        raise ValueError(f"tokens must be [N] with N = probs.shape[0] = {probs.shape[0]}, got {tokens.shape}")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be integer token ids, got dtype {tokens.dtype}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= probs.shape[1]):
        raise ValueError(f"token ids must lie in [0, V={probs.shape[1]}), got range [{tokens.min()}, {tokens.max()}]")
    return probs, tokens.astype(np.int64)


def _row_blocks(n_rows: int, n_cols: int) -> Iterable[slice]:
    step = max(1, _ROW_CHUNK_ELEMENTS // max(1, n_cols))
    for start in range(0, n_rows, step):
        yield slice(start, min(n_rows, start + step))


def _normalised_block(probs: np.ndarray, rows: slice) -> np.ndarray:
    """float64 copy of probs[rows] with each row divided by its sum (absorbs float32 rounding)."""
    block = np.asarray(probs[rows], dtype=np.float64)
    if (block < 0).any() or not np.isfinite(block).all():
        raise ValueError("probs must be finite and non-negative")
    total = block.sum(axis=1, keepdims=True)
    if (np.abs(total - 1.0) > 1e-3).any():
        raise ValueError("each row of probs must sum to 1 (pass probabilities, not logits)")
    return block / total


def _uniforms(n: int, rng: Any) -> np.ndarray:
    """n Uniform(0, 1) draws from an int seed, a numpy Generator or a (CPU) torch.Generator."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(rng, torch.Generator):
        return torch.rand(n, generator=rng, dtype=torch.float64).numpy()
    if isinstance(rng, (int, np.integer, np.random.Generator)):
        return np.random.default_rng(rng).random(n)
    raise TypeError(f"rng must be an int seed, numpy.random.Generator or torch.Generator, got {type(rng)}")


# ---------------------------------------------------------------------------------------------------
# PIT and surprisal: emitted tokens against their exact target conditionals
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenScores:
    """All that the PIT and surprisal tests need from (probs [N, V], tokens [N]): four numbers per token
    instead of V. Score a long run chunk by chunk with :func:`token_scores`, join the chunks with
    :meth:`concat`, and test them with :func:`exactness_test_from_scores`: the same math as
    :func:`exactness_test` (which is built on it) without ever holding [N, V] at once."""

    mass_before: np.ndarray  # [N] float64: p-mass of the tokens ranked before x under the PIT order
    p_token: np.ndarray  # [N] float64: p(x)
    entropy: np.ndarray  # [N] float64: H(p) in nats
    surprisal_var: np.ndarray  # [N] float64: Var_{y~p}(−log p(y)) = Σ p log² p − H², clipped at 0

    def __len__(self) -> int:
        return self.p_token.size

    def subset(self, idx: Any) -> TokenScores:  # idx: [n] indices or a boolean mask over the N rows
        return TokenScores(self.mass_before[idx], self.p_token[idx], self.entropy[idx], self.surprisal_var[idx])

    @staticmethod
    def concat(parts: Sequence[TokenScores]) -> TokenScores:
        if not parts:
            raise ValueError("TokenScores.concat needs at least one part")
        return TokenScores(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                             ("mass_before", "p_token", "entropy", "surprisal_var")))


def token_scores(
    probs: Any,  # [N, V] exact target conditionals, rows sum to 1
    tokens: Any,  # [N] emitted token ids
    *,
    order: PitOrder = "descending",
) -> TokenScores:
    """Per-token summaries for the PIT (under ``order``, see module docstring) and the surprisal test."""
    probs, tokens = _probs_and_tokens(probs, tokens)
    if order not in ("descending", "id"):
        raise ValueError(f"order must be 'descending' or 'id', got {order!r}")
    n, v = probs.shape
    before, p_x, entropy, var = np.empty(n), np.empty(n), np.empty(n), np.empty(n)
    for rows in _row_blocks(n, v):
        block = _normalised_block(probs, rows)
        tok = tokens[rows]
        px = block[np.arange(len(tok)), tok]
        if order == "id":
            ranked_before = np.arange(v)[None, :] < tok[:, None]
        else:  # strictly more likely, or equally likely with a smaller id
            ranked_before = (block > px[:, None]) | (
                (block == px[:, None]) & (np.arange(v)[None, :] < tok[:, None])
            )
        before[rows] = np.where(ranked_before, block, 0.0).sum(axis=1)
        p_x[rows] = px
        logp = np.log(block, out=np.zeros_like(block), where=block > 0)  # 0·log 0 = 0
        h = -(block * logp).sum(axis=1)
        entropy[rows] = h
        var[rows] = np.maximum((block * logp**2).sum(axis=1) - h**2, 0.0)
    return TokenScores(before, p_x, entropy, var)


def pit_from_scores(scores: TokenScores, rng: Any) -> np.ndarray:  # -> [N]
    """The randomised PIT values of :func:`pit_values`, from precomputed scores."""
    return np.clip(scores.mass_before + _uniforms(len(scores), rng) * scores.p_token, 0.0, 1.0)


def pit_values(
    probs: Any,  # [N, V] exact target conditionals, rows sum to 1
    tokens: Any,  # [N] emitted token ids
    *,
    rng: Any,
    order: PitOrder = "descending",
) -> np.ndarray:  # [N] in (0, 1); i.i.d. Uniform(0, 1) under H0
    """Randomised PIT u = F(x−1) + U·p(x), with F the CDF under ``order`` (see module docstring)."""
    return pit_from_scores(token_scores(probs, tokens, order=order), rng)


def uniformity_ks(u: Any, *, alpha: float = 0.05, name: str = "ks_uniform") -> Verdict:  # u: [N]
    """Kolmogorov–Smirnov test of u ~ Uniform(0, 1) (exact p-value for small N)."""
    _check_alpha(alpha)
    u = _to_numpy(u, np.float64).ravel()
    if u.size == 0:
        raise ValueError("uniformity_ks needs at least one value")
    res = stats.kstest(u, "uniform")
    return Verdict.from_p(name, res.statistic, res.pvalue, alpha, n=u.size)


def uniformity_chi2(
    u: Any, *, alpha: float = 0.05, bins: int | None = None, name: str = "chi2_uniform"
) -> Verdict:  # u: [N]
    """Pearson chi-square of u ~ Uniform(0, 1) on equal-width bins (default min(20, N // 5), so every
    bin expects ≥ 5 values and the asymptotic chi-square(bins − 1) null holds)."""
    _check_alpha(alpha)
    u = _to_numpy(u, np.float64).ravel()
    bins = bins if bins is not None else min(20, u.size // 5)
    if bins < 2:
        raise ValueError(f"uniformity_chi2 needs ≥ 2 bins (≥ 10 values by default), got {bins} for N={u.size}")
    counts = np.bincount(np.minimum((u * bins).astype(np.int64), bins - 1), minlength=bins)
    res = stats.chisquare(counts)
    return Verdict.from_p(name, res.statistic, res.pvalue, alpha, dof=bins - 1, n=u.size)


def surprisal_test_from_scores(scores: TokenScores, *, alpha: float = 0.05, name: str = "surprisal") -> Verdict:
    """:func:`surprisal_test` on precomputed :class:`TokenScores` (e.g. one stratum's rows)."""
    _check_alpha(alpha)
    n = len(scores)
    if (scores.p_token == 0).any():
        return Verdict.from_p(name, math.inf, 0.0, alpha, n=n)
    variance = float(scores.surprisal_var.sum())
    if variance == 0.0:  # every row one-hot (greedy) and every token its argmax
        return Verdict.from_p(name, 0.0, 1.0, alpha, n=n)
    z = float((-np.log(scores.p_token) - scores.entropy).sum()) / math.sqrt(variance)
    return Verdict.from_p(name, z, 2.0 * stats.norm.sf(abs(z)), alpha, n=n)


def surprisal_test(
    probs: Any,  # [N, V] exact target conditionals
    tokens: Any,  # [N] emitted token ids
    *,
    alpha: float = 0.05,
    name: str = "surprisal",
) -> Verdict:
    """Two-sided z-test of Σ_i (−log p_i(x_i) − H(p_i)) = 0 with variance Σ_i Var_i, where
    Var_i = Σ_x p_i(x) log² p_i(x) − H(p_i)². The statistic is z; p-value 0 if any token had p = 0."""
    _check_alpha(alpha)
    return surprisal_test_from_scores(token_scores(probs, tokens), alpha=alpha, name=name)


def pit_test(
    probs: Any,  # [N, V]
    tokens: Any,  # [N]
    *,
    rng: Any,
    alpha: float = 0.05,
    order: PitOrder = "descending",
    method: Literal["ks", "chi2"] = "ks",
) -> Verdict:
    """Randomised PIT followed by a KS (default) or equal-bin chi-square test of uniformity."""
    if method not in ("ks", "chi2"):
        raise ValueError(f"method must be 'ks' or 'chi2', got {method!r}")
    u = pit_values(probs, tokens, rng=rng, order=order)
    test = uniformity_ks if method == "ks" else uniformity_chi2
    return test(u, alpha=alpha, name=f"pit_{method}")


def exactness_test(
    probs: Any,  # [N, V] exact target conditionals of the emitted prefixes
    tokens: Any,  # [N] emitted token ids
    *,
    rng: Any,
    alpha: float = 0.01,
    positions: Any = None,  # [N] index of each token in its continuation, or None
    min_rows_per_position: int = 100,
) -> Verdict:
    """H0: every token is a draw from its row of ``probs``. Runs the PIT-KS and surprisal tests pooled
    over all rows and, if ``positions`` is given, for every position with ≥ ``min_rows_per_position``
    rows. Bonferroni over the m tests: each part is judged at α/m, the combined p-value is
    min(1, m · min p), and the family-wise false-rejection rate is ≤ α. The statistic is m."""
    _check_alpha(alpha)
    return exactness_test_from_scores(token_scores(probs, tokens), rng=rng, alpha=alpha, positions=positions,
                                      min_rows_per_position=min_rows_per_position)


def exactness_test_from_scores(
    scores: TokenScores,  # N tokens, as from token_scores (descending PIT order)
    *,
    rng: Any,
    alpha: float = 0.01,
    positions: Any = None,  # [N] index of each token in its continuation, or None
    min_rows_per_position: int = 100,
) -> Verdict:
    """:func:`exactness_test` on precomputed :class:`TokenScores` (identical math and error rate)."""
    _check_alpha(alpha)
    n = len(scores)
    u = pit_from_scores(scores, rng)
    groups: list[tuple[str, np.ndarray]] = [("pooled", np.arange(n))]
    if positions is not None:
        positions = _to_numpy(positions).ravel()
        if positions.shape != (n,):
            raise ValueError(f"positions must be [N] like tokens, got {positions.shape} vs ({n},)")
        for pos in np.unique(positions):
            idx = np.flatnonzero(positions == pos)
            if idx.size >= min_rows_per_position:
                groups.append((f"position={pos}", idx))
    m = 2 * len(groups)
    parts = []
    for label, idx in groups:
        parts.append(uniformity_ks(u[idx], alpha=alpha / m, name=f"pit_ks[{label}]"))
        parts.append(surprisal_test_from_scores(scores.subset(idx), alpha=alpha / m, name=f"surprisal[{label}]"))
    p_min = min(p.p_value for p in parts)
    return Verdict.from_p("exactness", m, m * p_min, alpha, n=n, parts=tuple(parts))


# ---------------------------------------------------------------------------------------------------
# Contingency tables: two samples, or one sample against a known distribution
# ---------------------------------------------------------------------------------------------------


def _pool_small(
    observed: np.ndarray, expected: np.ndarray, min_expected: float
) -> tuple[np.ndarray, np.ndarray]:  # [R, k] each -> [R, k'] each
    """Pool every category whose smallest expected count (over rows) is below ``min_expected`` into one
    "other" column. If "other" itself is still too small, merge it with the smallest remaining category,
    repeatedly. Pooling only ever merges columns, so the null distribution stays chi-square with the
    reduced dof; which columns merge depends on the column totals only, not on how they split by row."""
    small = expected.min(axis=0) < min_expected
    big_obs, big_exp = observed[:, ~small], expected[:, ~small]
    other_obs, other_exp = observed[:, small].sum(axis=1), expected[:, small].sum(axis=1)
    order = np.argsort(big_exp.sum(axis=0), kind="stable")  # merge smallest first if needed
    big_obs, big_exp = big_obs[:, order], big_exp[:, order]
    while small.any() and other_exp.min() < min_expected and big_obs.shape[1] > 0:
        other_obs, other_exp = other_obs + big_obs[:, 0], other_exp + big_exp[:, 0]
        big_obs, big_exp = big_obs[:, 1:], big_exp[:, 1:]
    if small.any():
        big_obs = np.column_stack([big_obs, other_obs])
        big_exp = np.column_stack([big_exp, other_exp])
    return big_obs, big_exp


def _table_statistic(observed: np.ndarray, expected: np.ndarray, statistic: str) -> float:
    if statistic == "chi2":
        return float(((observed - expected) ** 2 / expected).sum())
    ratio = np.where(observed > 0, observed / expected, 1.0)
    return float(2.0 * (observed * np.log(ratio)).sum())


def homogeneity_test(
    counts: Any,  # [R, k] counts: R samples over k categories
    *,
    statistic: Literal["chi2", "g"] = "chi2",
    alpha: float = 0.05,
    min_expected: float = 5.0,
) -> Verdict:
    """Chi-square (Pearson) or G (likelihood-ratio, with Williams' correction, which brings its small-
    sample false-rejection rate down to the nominal level) test that the R rows share one distribution.
    Categories expected < ``min_expected`` are pooled (see :func:`_pool_small`); dof = (R − 1)(k' − 1).
    A table that pools down to one category (every outcome rare, e.g. long continuations with few
    samples) carries no evidence and returns p = 1 with dof = 0: shorten the outcomes or sample more."""
    _check_alpha(alpha)
    if statistic not in ("chi2", "g"):
        raise ValueError(f"statistic must be 'chi2' or 'g', got {statistic!r}")
    counts = _to_numpy(counts, np.float64)
    if counts.ndim != 2 or counts.shape[0] < 2:
        raise ValueError(f"counts must be [R ≥ 2, k], got shape {counts.shape}")
    row_tot, col_tot = counts.sum(axis=1), counts.sum(axis=0)
    if (row_tot == 0).any():
        raise ValueError("every sample must contain at least one outcome")
    keep = col_tot > 0
    counts, col_tot = counts[:, keep], col_tot[keep]
    expected = np.outer(row_tot, col_tot) / row_tot.sum()
    observed, expected = _pool_small(counts, expected, min_expected)
    dof = (observed.shape[0] - 1) * (observed.shape[1] - 1)
    name = f"{statistic}_homogeneity"
    if dof == 0:
        return Verdict.from_p(name, 0.0, 1.0, alpha, dof=0, n=int(row_tot.sum()))
    stat = _table_statistic(observed, expected, statistic)
    if statistic == "g":  # Williams' correction: G / q is closer to chi-square(dof) in small samples
        n = row_tot.sum()
        rows_term = n * (1.0 / observed.sum(axis=1)).sum() - 1.0
        cols_term = n * (1.0 / observed.sum(axis=0)).sum() - 1.0
        stat /= 1.0 + rows_term * cols_term / (6.0 * n * dof)
    return Verdict.from_p(name, stat, stats.chi2.sf(stat, dof), alpha, dof=dof, n=int(row_tot.sum()))


def _two_sample_table(a: Any, b: Any) -> np.ndarray:  # -> [2, k]
    """Counts of each distinct outcome (token ids, tuples of ids, strings) in a and b."""
    ca, cb = Counter(_outcomes(a)), Counter(_outcomes(b))
    keys = list(ca.keys() | cb.keys())
    return np.array([[ca[k] for k in keys], [cb[k] for k in keys]], dtype=np.float64).reshape(2, len(keys))


def _outcomes(xs: Any) -> list[Hashable]:
    """Hashable outcomes: an array [n] gives its values, an array [n, L] one tuple per row, and list
    elements become tuples."""
    if not isinstance(xs, (list, tuple)):
        arr = _to_numpy(xs)
        return [tuple(row) for row in arr.tolist()] if arr.ndim == 2 else arr.ravel().tolist()
    return [tuple(x) if isinstance(x, list) else x for x in xs]


def chi2_two_sample(a: Sequence[Hashable], b: Sequence[Hashable], *, alpha: float = 0.05,
                    min_expected: float = 5.0) -> Verdict:  # a: [n_a] outcomes, b: [n_b] outcomes
    """Pearson chi-square test that two samples of discrete outcomes share one distribution."""
    return homogeneity_test(_two_sample_table(a, b), statistic="chi2", alpha=alpha, min_expected=min_expected)


def g_two_sample(a: Sequence[Hashable], b: Sequence[Hashable], *, alpha: float = 0.05,
                 min_expected: float = 5.0) -> Verdict:  # a: [n_a] outcomes, b: [n_b] outcomes
    """G-test (likelihood ratio) that two samples of discrete outcomes share one distribution."""
    return homogeneity_test(_two_sample_table(a, b), statistic="g", alpha=alpha, min_expected=min_expected)


def _counts(sample: Any, k: int) -> np.ndarray:  # sample: [n] ints in [0, k) -> [k]
    sample = _to_numpy(sample).ravel()
    if sample.size == 0 or not np.issubdtype(sample.dtype, np.integer):
        raise ValueError("sample must be a non-empty array of integer category indices")
    if sample.min() < 0 or sample.max() >= k:
        raise ValueError(f"sample values must lie in [0, {k}), got [{sample.min()}, {sample.max()}]")
    return np.bincount(sample, minlength=k).astype(np.float64)


def _distribution(probs: Any) -> np.ndarray:
    probs = _to_numpy(probs, np.float64).ravel()
    if (probs < 0).any() or abs(probs.sum() - 1.0) > 1e-6:
        raise ValueError("probs must be a non-negative vector summing to 1")
    return probs / probs.sum()


def chi2_goodness_of_fit(
    sample: Any,  # [n] category indices in [0, k)
    probs: Any,  # [k] known distribution
    *,
    alpha: float = 0.05,
    min_expected: float = 5.0,
) -> Verdict:
    """Pearson chi-square test that ``sample`` was drawn from ``probs``, small cells pooled as above.
    A draw from a category with probability 0 is impossible under H0 and gives p = 0."""
    _check_alpha(alpha)
    probs = _distribution(probs)
    counts = _counts(sample, probs.size)
    n = int(counts.sum())
    if (counts[probs == 0] > 0).any():
        return Verdict.from_p("chi2_gof", math.inf, 0.0, alpha, n=n)
    observed, expected = _pool_small(counts[None, probs > 0], n * probs[None, probs > 0], min_expected)
    dof = observed.shape[1] - 1
    if dof == 0:
        return Verdict.from_p("chi2_gof", 0.0, 1.0, alpha, dof=0, n=n)
    stat = _table_statistic(observed, expected, "chi2")
    return Verdict.from_p("chi2_gof", stat, stats.chi2.sf(stat, dof), alpha, dof=dof, n=n)


# ---------------------------------------------------------------------------------------------------
# Total-variation distance with guaranteed-coverage intervals
# ---------------------------------------------------------------------------------------------------


def _tv_deviation(n: int, k: int, delta: float) -> float:
    """λ with P(TV(p̂_n, q) > λ) ≤ delta for every q on k categories:
    E TV ≤ ½ Σ_j sqrt(q_j(1−q_j)/n) ≤ ½ sqrt((k−1)/n) (Jensen, then Cauchy–Schwarz), and TV(p̂_n, q)
    moves by ≤ 1/n when one draw changes, so McDiarmid adds sqrt(log(1/delta) / (2n))."""
    return 0.5 * math.sqrt(max(k - 1, 0) / n) + math.sqrt(math.log(1.0 / delta) / (2.0 * n))


def tv_to_distribution(
    sample: Any,  # [n] category indices in [0, k)
    probs: Any,  # [k] known distribution p
    *,
    confidence: float = 0.95,
    num_categories: int | None = None,
) -> tuple[float, float, float]:  # (estimate, lower, upper)
    """Plug-in TV(p̂, p) between the empirical distribution of ``sample`` and ``probs``, with an interval
    for TV(q, p), q the distribution the sample came from. By the triangle inequality
    |TV(p̂, p) − TV(q, p)| ≤ TV(p̂, q) ≤ λ with probability ≥ ``confidence`` (see :func:`_tv_deviation`),
    so coverage is ≥ ``confidence`` for every q: finite-sample and conservative. ``num_categories``
    (default k) must count every category q can put mass on. The plug-in estimate is biased upward by
    up to ½ sqrt((k−1)/n); the interval accounts for that."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    probs = _distribution(probs)
    counts = _counts(sample, probs.size)
    n = int(counts.sum())
    est = 0.5 * float(np.abs(counts / n - probs).sum())
    lam = _tv_deviation(n, num_categories or probs.size, 1.0 - confidence)
    return est, max(0.0, est - lam), min(1.0, est + lam)


def tv_two_sample(
    a: Sequence[Hashable],  # [n_a] outcomes
    b: Sequence[Hashable],  # [n_b] outcomes
    *,
    confidence: float = 0.95,
    num_categories: int | None = None,
) -> tuple[float, float, float]:  # (estimate, lower, upper)
    """Plug-in TV between the two empirical distributions, with an interval for the TV between the
    distributions they came from: |TV(â, b̂) − TV(a, b)| ≤ TV(â, a) + TV(b̂, b), each bounded as in
    :func:`tv_to_distribution` at (1 − confidence)/2, so coverage is ≥ ``confidence``. ``num_categories``
    must count every outcome either distribution can produce; the default, the number of distinct
    outcomes seen, is only valid when the samples are large enough to have seen them all."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    table = _two_sample_table(a, b)
    n_a, n_b = table.sum(axis=1)
    if n_a == 0 or n_b == 0:
        raise ValueError("both samples must be non-empty")
    est = 0.5 * float(np.abs(table[0] / n_a - table[1] / n_b).sum())
    k = num_categories or table.shape[1]
    delta = (1.0 - confidence) / 2.0
    lam = _tv_deviation(int(n_a), k, delta) + _tv_deviation(int(n_b), k, delta)
    return est, max(0.0, est - lam), min(1.0, est + lam)


# ---------------------------------------------------------------------------------------------------
# Power of the chi-square goodness-of-fit test against a TV shift
# ---------------------------------------------------------------------------------------------------


def _check_power_args(alpha: float, power: float, num_categories: int) -> None:
    _check_alpha(alpha)
    if not alpha < power < 1.0:
        raise ValueError(f"power must lie in (alpha, 1), got power={power!r}, alpha={alpha!r}")
    if int(num_categories) != num_categories or num_categories < 2:
        raise ValueError(f"num_categories must be an integer ≥ 2, got {num_categories!r}")


def _noncentrality(alpha: float, power: float, dof: int) -> float:
    """λ such that a noncentral chi-square(dof, λ) exceeds the level-alpha critical value w.p. power."""
    crit = stats.chi2.isf(alpha, dof)
    hi = 1.0
    while stats.ncx2.sf(crit, dof, hi) < power:
        hi *= 2.0
    return optimize.brentq(lambda lam: stats.ncx2.sf(crit, dof, lam) - power, 1e-12, hi, xtol=1e-10)


def samples_needed(delta: float, alpha: float = 0.05, power: float = 0.8, *, num_categories: int) -> int:
    """Samples n for the k-category chi-square goodness-of-fit test to reach ``power`` at level ``alpha``
    against *every* alternative q with TV(q, p) ≥ delta.

    Under q the statistic is ≈ noncentral chi-square(k − 1, n·w²), w² = Σ (q_j − p_j)² / p_j. By
    Cauchy–Schwarz, (2 TV)² = (Σ |q_j − p_j|)² ≤ w² · Σ p_j, so w ≥ 2·TV, with equality when the shift
    is proportional to p (|q_j − p_j| = 2δ·p_j). We assume that worst case, w = 2δ; typical biases
    (mass moved into a low-probability category) have larger w and are caught with fewer samples."""
    if not 0.0 < delta <= 1.0:
        raise ValueError(f"delta (a TV distance) must lie in (0, 1], got {delta!r}")
    _check_power_args(alpha, power, num_categories)
    n = _noncentrality(alpha, power, num_categories - 1) / (4.0 * delta**2)
    return max(1, math.ceil(n * (1.0 - 1e-12)))  # the 1e-12 absorbs rounding in detectable_tv(n)


def detectable_tv(n: int, alpha: float = 0.05, power: float = 0.8, *, num_categories: int) -> float:
    """Smallest TV shift δ that n samples detect with ``power`` at level ``alpha`` under the worst-case
    relation w = 2δ of :func:`samples_needed` (its inverse). A value > 1 means no shift is guaranteed."""
    if int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    _check_power_args(alpha, power, num_categories)
    return 0.5 * math.sqrt(_noncentrality(alpha, power, num_categories - 1) / n)


# ---------------------------------------------------------------------------------------------------
# A rate with known conditional probabilities: z-test and its power
# ---------------------------------------------------------------------------------------------------


def hit_rate_test(
    hits: Any,  # [n] bool: whether each event happened
    probs: Any,  # [n] its probability under H0, given everything before it
    *,
    alpha: float = 0.05,
    name: str = "hit_rate",
) -> Verdict:
    """Two-sided z-test of Σ hits = Σ probs. Under H0 each hit_i is Bernoulli(probs_i) given everything
    before it (probs_i known before hit_i is drawn), so Σ (hit_i − probs_i) is a martingale with predictable
    variance Σ probs_i (1 − probs_i), and z = that sum / its standard deviation is asymptotically N(0, 1)
    (martingale CLT), however the events depend on each other. The statistic is z: positive when events
    happen more often than H0 says. With zero variance (every prob 0 or 1) any mismatch gives p = 0."""
    _check_alpha(alpha)
    hits, probs = _to_numpy(hits).astype(np.float64).ravel(), _to_numpy(probs, np.float64).ravel()
    if hits.shape != probs.shape:
        raise ValueError(f"hits and probs must both be [n], got {hits.shape} and {probs.shape}")
    if ((probs < 0) | (probs > 1) | np.isnan(probs)).any():
        raise ValueError("probs must be probabilities in [0, 1]")
    excess = float((hits - probs).sum())
    variance = float((probs * (1.0 - probs)).sum())
    if variance == 0.0:
        mismatch = abs(excess) > 1e-9
        return Verdict.from_p(name, math.inf if mismatch else 0.0, 0.0 if mismatch else 1.0, alpha, n=hits.size)
    z = excess / math.sqrt(variance)
    return Verdict.from_p(name, z, 2.0 * stats.norm.sf(abs(z)), alpha, n=hits.size)


def _z_sum(alpha: float, power: float) -> float:
    _check_alpha(alpha)
    if not alpha / 2 < power < 1.0:
        raise ValueError(f"power must lie in (alpha/2, 1), got power={power!r}, alpha={alpha!r}")
    return float(stats.norm.isf(alpha / 2) + stats.norm.isf(1.0 - power))


def hit_rate_detectable_shift(n: int, mean_variance: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest shift δ of every event's probability (probs_i → probs_i + δ) that :func:`hit_rate_test` on n
    events detects with ``power`` at level ``alpha``: (z_{1−α/2} + z_power) · sqrt(v / n), v = the mean of
    probs_i (1 − probs_i) (normal approximation, the other tail ignored). A bias that moves TV δ of mass
    toward (or away from) the events' outcomes shifts their probability by δ: the same figure bounds it."""
    if int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if not 0.0 < mean_variance <= 0.25:
        raise ValueError(f"mean_variance (mean of p(1 − p)) must lie in (0, 0.25], got {mean_variance!r}")
    return _z_sum(alpha, power) * math.sqrt(mean_variance / n)


def hit_rate_samples_needed(delta: float, mean_variance: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Events n for :func:`hit_rate_test` to detect a shift ``delta`` with ``power`` (inverse of
    :func:`hit_rate_detectable_shift`)."""
    if not 0.0 < delta <= 1.0:
        raise ValueError(f"delta (a shift of a probability) must lie in (0, 1], got {delta!r}")
    if not 0.0 < mean_variance <= 0.25:
        raise ValueError(f"mean_variance (mean of p(1 − p)) must lie in (0, 0.25], got {mean_variance!r}")
    return max(1, math.ceil((_z_sum(alpha, power) / delta) ** 2 * mean_variance * (1.0 - 1e-12)))


# ---------------------------------------------------------------------------------------------------
# Multiple testing
# ---------------------------------------------------------------------------------------------------


def _p_array(pvalues: Any) -> np.ndarray:
    p = _to_numpy(pvalues, np.float64).ravel()
    if ((p < 0) | (p > 1) | np.isnan(p)).any():
        raise ValueError("p-values must lie in [0, 1]")
    return p


def bonferroni(pvalues: Any, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:  # [m] -> [m], [m]
    """Adjusted p-values min(1, m·p) and reject flags; family-wise error ≤ alpha under any dependence."""
    _check_alpha(alpha)
    p = _p_array(pvalues)
    adjusted = np.minimum(1.0, p * p.size)
    return adjusted, adjusted <= alpha


def holm(pvalues: Any, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:  # [m] -> [m], [m]
    """Holm–Bonferroni step-down: adjusted p_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j)) in ascending
    order. Family-wise error ≤ alpha under any dependence, and never rejects less than Bonferroni."""
    _check_alpha(alpha)
    p = _p_array(pvalues)
    m = p.size
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    adjusted = np.empty(m)
    adjusted[order] = stepped
    return adjusted, adjusted <= alpha
