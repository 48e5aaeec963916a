"""The main job's table: one row per prompt category and ALL, end to end and decode only, then the lines that say
what the figures rest on (step costs, the prefill's share, the speed of light, graph captures, exactness)."""

from __future__ import annotations

import math
from typing import Any


def format_table(results: dict[str, Any]) -> str:
    """The table ``python -m specdec.run`` prints, from its ``results.json`` fields."""
    # predicted: from measured costs, which fits trees as well as chains (Leviathan's formula, under the table,
    # assumes a chain verified at a plain step's cost); like decode only, it leaves the prefill out
    rates = f"{'tok/s':>9}{'base tok/s':>11}{'speedup':>9}{'95% CI':>12}"
    head = f"{'category':<19}{'prompts':>8}{'α':>7}{'τ':>7}{rates}{rates}{'predicted':>11}"
    groups = f"{'':<41}{'end to end (with prefill)':^41}{'decode only (no prefill)':^41}"
    lines = [groups.rstrip(), head, "-" * len(head)]
    rows = list(results["per_category"].items()) + [("ALL", results)]
    for name, r in rows:
        prompts = f"{r['num_prompts']}{'*' if r.get('few_prompts') else ''}"
        lines.append(
            f"{name:<19}{prompts:>8}{r['acceptance_rate']:>7.3f}{r['mean_accepted_length']:>7.2f}"
            f"{r['tokens_per_second']:>9.1f}{r['baseline_tokens_per_second']:>11.1f}{r['speedup']:>8.2f}x"
            f"{_interval(r.get('speedup_interval')):>12}"
            f"{r['decode_tokens_per_second']:>9.1f}{r['baseline_decode_tokens_per_second']:>11.1f}"
            f"{r['decode_speedup']:>8.2f}x{_interval(r.get('decode_speedup_interval')):>12}"
            f"{r['predicted_speedup_measured_costs']:>10.2f}x"
        )
    lines.append("95% CI: the speedup's interval over its prompts, resampled (a bootstrap)"
                 + ("; * fewer than 3 prompts: no interval, too few to tell the speedup from noise"
                    if any(r.get("few_prompts") for _, r in rows) else ""))
    measured = list(results["acceptance_per_position"])
    while measured and math.isnan(measured[-1]):  # depths no step reached (a tree's k exceeds its depth)
        measured.pop()
    pos = ", ".join(f"{a:.2f}" for a in measured)
    lines.append(f"acceptance per position: [{pos}]   cost ratio c = {results['cost_ratio']:.3f}   on {results['device']}")
    if "verify_step_time_s" in results:
        lines.append(f"verify forward {1000 * results['verify_step_time_s']:.1f} ms vs plain step "
                     f"{1000 * results['target_step_time_s']:.1f} ms; predicted = τ · plain step / (verify + draft "
                     f"time per step)")
    if results.get("wall_time_s", 0) > 0:
        share = f"prefill: {results['prefill_time_s'] / results['wall_time_s']:.0%} of the end-to-end time"
        if results["baseline_wall_time_s"] > 0:
            share += f" ({results['baseline_prefill_time_s'] / results['baseline_wall_time_s']:.0%} for plain decoding)"
        lines.append(share + ", left out of the decode-only figures with the token it gives")
    if results.get("drafting") == "chain" and not math.isnan(results["predicted_speedup"]):
        lines.append(f"Leviathan's chain formula (verify at a plain step's cost): {results['predicted_speedup']:.2f}x")
    if "bandwidth_fraction" in results:
        lines.append(f"speed of light: a step reads {results['step_bytes'] / 1e6:.0f} MB (weights + KV cache); at "
                     f"{results['read_bandwidth_GBps']:.1f} GB/s (probe) the floor is "
                     f"{1000 * results['bandwidth_floor_s']:.1f} ms: plain steps at {results['bandwidth_fraction']:.0%} "
                     f"of it, verify steps at {results['bandwidth_fraction_verify']:.0%}")
    graphs = [f"{who} {results[f'{key}captures']} shapes in {results[f'{key}capture_time_s']:.1f} s"
              for who, key in (("target", "cuda_graph_"), ("drafter", "drafter_graph_"))
              if results.get(f"{key}captures") is not None]
    if graphs:
        lines.append(f"graphs captured (one-off, left out of the timings above): {', '.join(graphs)}")
    if results.get("lossy"):
        lines.append("LOSSY: the drafter verifies with a lossy acceptance rule (typical acceptance); at temperature "
                     "> 0 the output is not distributed as the target's")
    if results.get("auto"):
        auto = results["auto"]
        predicted = ", ".join(f"{k}: {x:.2f}x" for k, x in auto["predicted_speedup"].items())
        lines.append(f"drafter.k=auto chose k={auto['k']}{' (plain decoding)' if auto['k'] == 0 else ''} from the "
                     f"decode speedups a replay of {auto['prompts']} held-out prompts predicted ({predicted}; "
                     f"{auto['seconds']:.0f} s)")
    if results.get("greedy_mismatches") is not None:
        lines.append(f"greedy outputs identical to plain decoding: {results['greedy_mismatches'] == 0} "
                     f"({results['greedy_mismatches']} mismatching rows)")
    return "\n".join(lines)


def _interval(interval: list[float] | None) -> str:
    return "–" if not interval else f"{interval[0]:.2f}-{interval[1]:.2f}x"
