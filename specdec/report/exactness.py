"""The figure of one ``python -m specdec.verify_dist`` run (verify.png): the PIT histogram, each position's
PIT ECDF in the KS band, −log10 p per position, and the tests that decide the verdict (the family's smallest
Holm-adjusted p-values, the strata's tests included: a verifier bug often shows only there)."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps


DECIDING_TESTS = 12  # the tests with the smallest Holm-adjusted p-values drawn in the last panel


def deciding_tests(report: dict, count: int = DECIDING_TESTS) -> list[dict]:
    """The ``count`` tests of the family (``report["tests"]``) with the smallest Holm-adjusted p-values, smallest
    first (ties, as at Holm's cap of 1, by raw p): the verdict rejects exactly when the first is ≤ the
    significance level."""
    return sorted(report["tests"], key=lambda t: (t["p_holm"], t["p_value"]))[:count]


def plot_result(result):  # a specdec.verify_dist.VerifyResult
    """Four panels: the pooled PIT histogram; each position's PIT ECDF minus the uniform CDF, within the
    KS band of the level one test is held to; −log10 p per position; the deciding tests (:func:`deciding_tests`),
    −log10 of their Holm-adjusted p against the significance level. Returns a matplotlib Figure."""
    from matplotlib.figure import Figure

    report, pit = result.report, result.pit
    rows, length = pit.shape
    level = report["detectable_tv"]["level"]
    fig = Figure(figsize=(21, 4.6))
    ax_hist, ax_ecdf, ax_p, ax_holm = fig.subplots(1, 4, width_ratios=[1, 1, 1, 1.3])

    bins = 20
    counts = np.bincount(np.minimum((pit.ravel() * bins).astype(int), bins - 1), minlength=bins)
    expected, sd = pit.size / bins, math.sqrt(pit.size / bins * (1 - 1 / bins))
    ax_hist.bar((np.arange(bins) + 0.5) / bins, counts, width=1 / bins, color="tab:blue", alpha=0.7)
    ax_hist.axhspan(expected - 3 * sd, expected + 3 * sd, color="grey", alpha=0.25, label="expected ± 3σ")
    ax_hist.set(title=f"PIT, all {pit.size} tokens", xlabel="u", ylabel="tokens")
    ax_hist.legend(loc="lower center")

    grid = np.linspace(0, 1, 201)
    for t in range(length):
        ecdf = np.searchsorted(np.sort(pit[:, t]), grid, side="right") / rows
        ax_ecdf.plot(grid, ecdf - grid, color=_colour(t, length), lw=1)
    band = sps.kstwo.ppf(1 - level, rows)
    ax_ecdf.axhspan(-band, band, color="grey", alpha=0.25, label=f"KS band at level {level:.1e}")
    ax_ecdf.set(title="PIT ECDF − uniform, per position (light → dark)", xlabel="u", ylabel="deviation")
    ax_ecdf.legend(loc="lower center")

    positions = [p["position"] for p in report["per_position"] if p["pit_ks"]]
    for key, marker, colour in (("pit_ks", "o", "tab:blue"), ("pit_chi2", "^", "tab:purple"),
                                ("surprisal", "s", "tab:orange")):
        ps = [p[key]["p_value"] for p in report["per_position"] if p[key]] + [report["pooled"][key]["p_value"]]
        ax_p.plot(positions + [length + 1], -np.log10(np.maximum(ps, 1e-300)), marker, color=colour, label=key)
    if report["two_sample"]:
        ax_p.plot([length + 3], [-math.log10(max(report["two_sample"]["p_value"], 1e-300))], "D", color="tab:green",
                  label=report["two_sample"]["outcome"])
    ax_p.axhline(-math.log10(level), color="red", ls="--", label="Bonferroni level")
    ax_p.set_xticks(list(range(0, length, max(1, length // 8))) + [length + 1, length + 3],
                    [str(t) for t in range(0, length, max(1, length // 8))] + ["all", "joint"])
    ax_p.set(title="tests per position, pooled (all), two-sample (joint)", xlabel="position t", ylabel="−log10 p")
    ax_p.legend()
    _plot_deciding_tests(ax_holm, report)

    title = (f"{report.get('drafter', 'drafter')} K={report.get('k', '?')}: "
             f"{report['verdict'].upper()} at significance level {report['significance']} "
             f"(p = {report['p_value']:.2g}); "
             f"detectable TV per position {report['detectable_tv']['per_position']:.3f} "
             f"(power {report['detectable_tv']['power']})")
    if report["planted_bug"]:
        title = f"PLANTED BUG {report['planted_bug']} — " + title
    fig.suptitle(title, color="red" if report["planted_bug"] else "black")
    fig.tight_layout()
    return fig


def _plot_deciding_tests(ax, report: dict) -> None:
    """−log10 of the smallest Holm-adjusted p-values, one bar per test (red where it rejects), against −log10 of
    the significance level:
    whichever test decided the verdict (a stratum's draft-match test, say) is the top bar."""
    tests = deciding_tests(report)
    heights = -np.log10(np.maximum([t["p_holm"] for t in tests], 1e-300))
    ax.barh(range(len(tests)), heights, color=["tab:red" if t["reject"] else "tab:grey" for t in tests])
    ax.set_yticks(range(len(tests)), [t["name"] for t in tests], fontsize="small")
    ax.invert_yaxis()  # the smallest p on top
    ax.axvline(-math.log10(report["significance"]), color="red", ls="--",
               label=f"significance level {report['significance']} (reject beyond)")
    ax.set(title=f"deciding tests: the {len(tests)} smallest Holm-adjusted p of {report['num_tests']}",
           xlabel="−log10 p (Holm-adjusted)")
    ax.legend(loc="lower right")


def _colour(t: int, length: int):
    from matplotlib import colormaps

    return colormaps["viridis_r"](0.15 + 0.85 * t / max(1, length - 1))


# --- the job ----------------------------------------------------------------------------------------------
