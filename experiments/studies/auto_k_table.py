"""``drafter.k=auto`` against fixed lookaheads: the table of one or more main-job sweeps.

    python -m specdec.run -m drafter.k=auto,4,8,12,16,24 data.batch_size=1,4 sampling=greedy,sample \\
        target.coded_weights=true,false
    python experiments/studies/auto_k_table.py multirun/<date>/<time> [more sweep directories]

Groups the runs by (drafter, batch size, temperature, weight format) and prints, per group, each fixed k's decode-only
speedup over plain decoding (measured in its own run), what ``k=auto`` chose with its measured speedup and the
predictions it chose from, and whether it kept the two aims: at least 0.95x plain decoding, and within 5% of the
best fixed k. Each run's speedup is against plain decoding in the same process.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def runs(directories: list[Path]) -> list[dict]:
    found = []
    for directory in directories:
        for path in sorted(directory.glob("*/results.json")):
            result = json.loads(path.read_text())
            if result.get("status") != "ok":
                print(f"left out (failed): {path}: {result.get('error')}")
                continue
            overrides = (path.parent / ".hydra" / "overrides.yaml").read_text()
            result["weights"] = "float32" if "target.coded_weights=False" in overrides else "codes"
            found.append(result)
    return found


def table(results: list[dict]) -> str:
    groups: dict[tuple, dict] = defaultdict(dict)
    for r in results:
        groups[(r["drafter"], r["batch_size"], r["temperature"], r["weights"])][str(r["k"])] = r
    fixed_ks = sorted({k for g in groups.values() for k in g if k != "auto"}, key=int)
    lines = ["| drafter | batch | T | weights | plain tok/s (auto's run) | " + "".join(f"k={k} | " for k in fixed_ks)
             + "auto chose | auto | predicted (auto's calibration) | ≥ 0.95x | within 5% of the best fixed k |",
             "|" + "---|" * (len(fixed_ks) + 10)]
    for (drafter, batch, temperature, weights), group in sorted(groups.items()):
        fixed = {k: group[k]["decode_speedup"] for k in fixed_ks if k in group}
        auto = group.get("auto")
        cells = [f"{fixed[k]:.2f}x" if k in fixed else "–" for k in fixed_ks]
        plain = (auto or next(iter(group.values())))["baseline_decode_tokens_per_second"]  # auto's run where there
        row = [drafter, str(batch), f"{temperature:g}", weights, f"{plain:.0f}", *cells]
        if auto:
            best = max(fixed.values(), default=float("nan"))
            chosen, measured = auto["k_chosen"], auto["decode_speedup"]
            predicted = ", ".join(f"{k}: {x:.2f}" for k, x in auto["auto"]["predicted_speedup"].items())
            within = "–" if not fixed else "yes" if measured >= 0.95 * best else f"NO (best {best:.2f}x)"
            row += [str(chosen) if chosen else "0 (plain)", f"{measured:.2f}x", predicted,
                    "yes" if measured >= 0.95 else "NO", within]
        else:
            row += ["–"] * 5
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", nargs="+", type=Path, help="main-job sweep directories (multirun/<date>/<time>)")
    args = parser.parse_args()
    print(table(runs(args.sweeps)))


if __name__ == "__main__":
    main()
