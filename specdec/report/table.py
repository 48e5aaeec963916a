"""The main job's table: one row per prompt category and ALL, end to end and decode only, then the lines that say
what the figures rest on (step costs, the prefill's share, the speed of light, graph captures, exactness); and a
replay's table (:func:`format_replay_table`), whose one figure is its prediction."""

from __future__ import annotations

import math
from typing import Any

SLOWER = 0.95  # a run below this many times plain decoding's speed (with a fixed drafter.k) is pointed to drafter.k=auto


def format_table(results: dict[str, Any]) -> str:
    """The table ``python -m specdec.run`` prints, from its ``results.json`` fields."""
    # predicted: from measured costs, which fits trees as well as chains (Leviathan's formula, under the table,
    # assumes a chain verified at a plain step's cost); like decode only, it leaves the prefill out
    rates = f"{'tok/s':>9}{'base tok/s':>11}{'speedup':>9}{'95% CI':>12}"
    head = f"{'category':<19}{'prompts':>8}{'α':>7}{'τ':>7}{rates}{rates}{'predicted':>11}"
    groups = f"{'':<41}{'end to end (with prefill)':^41}{'decode only (no prefill)':^41}"
    lines = [f"{_setting(results)} against plain decoding on the same prompts: speedup = measured wall clock, "
             f"predicted = from the run's measured step costs", groups.rstrip(), head, "-" * len(head)]
    rows = list(results["per_category"].items()) + [("ALL", results)]
    for name, r in rows:
        lines.append(
            f"{_lead(name, r)}"
            f"{r['tokens_per_second']:>9.1f}{r['baseline_tokens_per_second']:>11.1f}{r['speedup']:>8.2f}x"
            f"{_interval(r.get('speedup_interval')):>12}"
            f"{r['decode_tokens_per_second']:>9.1f}{r['baseline_decode_tokens_per_second']:>11.1f}"
            f"{r['decode_speedup']:>8.2f}x{_interval(r.get('decode_speedup_interval')):>12}"
            f"{r['predicted_speedup']:>10.2f}x"
        )
    lines += _under_rows(results, rows)
    if "verify_step_time_s" in results:
        lines.append(f"verify forward {1000 * results['verify_step_time_s']:.1f} ms vs plain step "
                     f"{1000 * results['target_step_time_s']:.1f} ms; predicted = τ · plain step / (verify + draft "
                     f"time per step)")
    if results.get("wall_time_s", 0) > 0:
        share = f"prefill: {results['prefill_time_s'] / results['wall_time_s']:.0%} of the end-to-end time"
        if results["baseline_wall_time_s"] > 0:
            share += f" ({results['baseline_prefill_time_s'] / results['baseline_wall_time_s']:.0%} for plain decoding)"
        lines.append(share + ", left out of the decode-only figures with the token it gives")
    if results.get("drafting") == "chain" and not math.isnan(results["leviathan_chain_formula"]):
        lines.append(f"Leviathan's chain formula (verify at a plain step's cost): "
                     f"{results['leviathan_chain_formula']:.2f}x")
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
    elif (lost := min(results["speedup"], results["decode_speedup"])) < SLOWER:
        lines.append(f"speculative decoding ran at {lost:.2f}x plain decoding here: drafter.k=auto chooses the lookahead "
                     f"that pays on this machine at this batch size and temperature, or plain decoding (its first run "
                     f"calibrates for a minute or two, then it is cached)")
    if results.get("greedy_mismatches") is not None:
        lines.append(f"greedy outputs identical to plain decoding: {results['greedy_mismatches'] == 0} "
                     f"({results['greedy_mismatches']} mismatching rows)")
    return "\n".join(lines)


def format_replay_table(results: dict[str, Any]) -> str:
    """The table ``python -m specdec.replay`` prints, from its ``results.json`` fields: α and τ as a live run gives
    them, and one figure of speed, the decode speedup the replay predicts from this machine's measured costs (with
    the rates it rests on and its interval over the prompts), then the prediction at each lookahead the log
    covers, the best marked. A replay times no prefill and measures no wall clock: there is nothing end to end."""
    head = (f"{'category':<19}{'prompts':>8}{'α':>7}{'τ':>7}{'tok/s':>9}{'base tok/s':>11}"
            f"{'predicted (replay)':>20}{'95% CI':>12}")
    drafting = results.get("drafting_from_curve")
    source = (f"the step-cost curve {results['costs_from']} ({results.get('device')}; "
              + (f"PREDICTED: the drafter's steps from its rows, {drafting}; the loop's host work left out)" if drafting
                 else "the drafter's steps counted free: an upper bound)")
              if results.get("costs_from") else "this machine's measured costs")
    lines = [f"{_setting(results)}, REPLAYED against plain decoding: speedup predicted from {source}, decode only "
             f"(no prefill); no wall clock measured", head, "-" * len(head)]
    rows = list(results["per_category"].items()) + [("ALL", results)]
    for name, r in rows:
        lines.append(f"{_lead(name, r)}{r['decode_tokens_per_second']:>9.1f}"
                     f"{r['baseline_decode_tokens_per_second']:>11.1f}{r['predicted_speedup']:>19.2f}x"
                     f"{_interval(r.get('predicted_speedup_interval')):>12}")
    lines += _under_rows(results, rows)
    if "verify_step_time_s" in results:
        lines.append(f"cost model: verify forward {1000 * results['verify_step_time_s']:.1f} ms vs plain step "
                     f"{1000 * results['target_step_time_s']:.1f} ms, "
                     + (("host work not in the curve" if drafting else "neither drafting nor host work in the curve")
                        if results.get("costs_from")
                        else "the loop's host work included in the prediction"))
    by_k = results.get("predicted_speedup_by_k")
    if by_k and len(by_k) > 1:
        best = max(by_k, key=lambda k: (by_k[k], -int(k)))
        lines.append("predicted (replay) at each k the log covers: " + ", ".join(
            f"{k}: {x:.2f}x{' (best k)' if k == best else ''}" for k, x in by_k.items()))
    return "\n".join(lines)


def _setting(results: dict[str, Any]) -> str:
    """What a table's figures are for: the drafter, the lookahead it decoded with (k=auto's choice marked) and the
    shape of its drafts, e.g. ``ngram, k=4 (chain drafts)``."""
    k = results.get("k_chosen", results["k"])
    chosen = " chosen by drafter.k=auto" if results["k"] == "auto" else ""
    shape = "plain decoding" if k == 0 else f"{results['drafting']} drafts"
    return f"{results['drafter']}, k={k}{chosen} ({shape})"


def _lead(name: str, r: dict[str, Any]) -> str:
    """A row's first cells: the category, its prompts (* where too few for an interval), α and τ."""
    prompts = f"{r['num_prompts']}{'*' if r.get('few_prompts') else ''}"
    return f"{name:<19}{prompts:>8}{r['acceptance_rate']:>7.3f}{r['mean_accepted_length']:>7.2f}"


def _under_rows(results: dict[str, Any], rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The lines right under a table's rows: what its intervals are, and the acceptance per position, cost ratio and
    machine of the whole run."""
    measured = list(results["acceptance_per_position"])
    while measured and math.isnan(measured[-1]):  # depths no step reached (a tree's k exceeds its depth)
        measured.pop()
    pos = ", ".join(f"{a:.2f}" for a in measured)
    return ["95% CI: the speedup's interval over its prompts, resampled (a bootstrap)"
            + ("; * fewer than 3 prompts (at a batch > 1: batches, the unit timed): no interval, too few to tell the "
               "speedup from noise" if any(r.get("few_prompts") for _, r in rows) else ""),
            f"acceptance per position: [{pos}]   cost ratio c = {results['cost_ratio']:.3f}   on {results['device']}"]


def _interval(interval: list[float] | None) -> str:
    return "–" if not interval else f"{interval[0]:.2f}-{interval[1]:.2f}x"
