"""Power of each exactness test against each planted bug, and the false rejections of the exact verifier,
over seeds, on the tiny models of tests/exactness/test_verify_dist.py (peaked target, close and far drafts).

    python experiments/studies/strata_power.py                  # 20 seeds per bug, 200 exact seeds, level 0.01
    python experiments/studies/strata_power.py --seeds 5 --null-seeds 20 --out /tmp/quick.json
    python experiments/studies/strata_power.py --n 1000 --bugs sibling_q_not_renormalised sibling_q_before_processing \
        --null-settings eagle_sampled_tree --null-seeds 20         # the sampled-tree bugs, and that tree exact

A test "rejects" when its Holm-adjusted p (over the whole family, as verify_dist reports it) is ≤ the
significance level.
Groups: the tests verify_dist had before the strata (pooled, per position, first-tokens two-sample) and
the same family without the stratified tests ("before": what the tool said then); the stratified PIT/
surprisal tests per stratum; the draft-match tests; the sibling-match tests (sampled tree candidates).
Writes the counts as JSON and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "exactness")]  # the tiny models and planted-bug cases live with the tests

from test_verify_dist import BUG_CASES, check, noisy_copy, peaked_llama  # noqa: E402

from specdec.exactness.stats import holm  # noqa: E402

NULL_SETTINGS = [("draft_model", 4, 1.0, 0, 1.0), ("ngram", 3, 0.7, 0, 0.9), ("draft_model_far", 2, 0.7, 10, 1.0),
                 ("ngram", 4, 1.0, 0, 1.0), ("medusa_tree", 8, 1.0, 0, 1.0), ("eagle_sampled_tree", 8, 1.0, 0, 1.0),
                 ("eagle_sampled_tree", 8, 0.7, 10, 0.9)]


def group(name: str) -> str:
    """Which column a test of the family counts in."""
    if name.startswith("sibling_match["):
        return "siblings"
    if name.startswith("draft_match["):
        return "match[drafted]" if "stratum=drafted" in name else "match[depth]"
    if "stratum=" in name:
        label = name.split("stratum=")[1].rstrip("]")
        return "PIT/surprisal[" + ("depth" if label.startswith("depth=") else label) + "]"
    if "position=" in name:
        return "per position"
    return "two-sample" if name.startswith("chi2_two_sample") else "pooled"


COLUMNS = ["family", "before", "pooled", "per position", "two-sample", "PIT/surprisal[drafted]", "match[drafted]",
           "PIT/surprisal[depth]", "match[depth]", "siblings", "PIT/surprisal[undrafted]", "PIT/surprisal[bonus]"]


def outcome(report: dict, significance: float) -> dict[str, bool | None]:
    """Per column: whether any of its tests rejected (None: the run had no such test)."""
    out: dict[str, bool | None] = {c: None for c in COLUMNS}
    out["family"] = report["verdict"] == "reject"
    old = [t for t in report["tests"] if "stratum=" not in t["name"]]
    out["before"] = bool(holm([t["p_value"] for t in old], significance)[1].any())
    for t in report["tests"]:
        g = group(t["name"])
        out[g] = bool(out[g]) or t["reject"]
    return out


def tally(outcomes: list[dict]) -> dict[str, str]:
    cells = {}
    for c in COLUMNS:
        seen = [o[c] for o in outcomes if o[c] is not None]
        cells[c] = f"{sum(seen)}/{len(seen)}" if seen else "-"
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20, help="seeds per planted bug")
    parser.add_argument("--null-seeds", type=int, default=200, help="seeds of the exact verifier")
    parser.add_argument("--n", type=int, default=250, help="continuations per prompt (4 prompts)")
    parser.add_argument("--length", type=int, default=8)
    parser.add_argument("--significance", type=float, default=0.01)
    parser.add_argument("--bugs", nargs="*", default=None, help="only these planted bugs (default: every case)")
    parser.add_argument("--null-settings", nargs="*", default=None,
                        help="cycle only the exact settings of these drafters (default: all of them)")
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "strata_power.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    target = peaked_llama()
    models = {"target": target, "close": noisy_copy(target),
              "far": peaked_llama(hidden=16, layers=1, heads=2, kv_heads=1, seed=7)}
    results: dict[str, dict] = {}
    started = time.perf_counter()

    def run(label: str, cases: list[tuple], bug: str | None) -> None:
        outcomes = []
        for seed, (drafter, k, t, top_k, top_p) in cases:
            report = check(models, drafter, bug=bug, k=k, temperature=t, top_k=top_k, top_p=top_p, n=args.n,
                           length=args.length, seed=seed, significance=args.significance).report
            outcomes.append(outcome(report, args.significance))
        results[label] = {"seeds": len(cases), "rejections": tally(outcomes), "elapsed_s": time.perf_counter() - started}
        print(label, results[label]["rejections"], flush=True)

    nulls = [s for s in NULL_SETTINGS if args.null_settings is None or s[0] in args.null_settings]
    for bug, drafter, k, t, top_k, top_p in BUG_CASES:
        if args.bugs is not None and bug not in args.bugs:
            continue
        run(f"{bug} / {drafter} K={k} T={t} top_k={top_k} top_p={top_p}",
            [(100 + s, (drafter, k, t, top_k, top_p)) for s in range(args.seeds)], bug)
    run("exact verifier (settings cycled)",
        [(1000 + s, nulls[s % len(nulls)]) for s in range(args.null_seeds)], None)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"n": args.n, "length": args.length, "significance": args.significance, "prompts": 4,
                                    "results": results}, indent=2))
    print("\n| case | " + " | ".join(COLUMNS) + " |\n|" + "---|" * (len(COLUMNS) + 1))
    for label, r in results.items():
        print(f"| {label} | " + " | ".join(r["rejections"][c] for c in COLUMNS) + " |")
    print(f"\n{time.perf_counter() - started:.0f} s; counts written to {args.out}")


if __name__ == "__main__":
    main()
