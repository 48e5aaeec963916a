"""Main job: speculative vs plain decoding of one configuration on a real prompt set.

    python -m specdec.run                                  # embedded SmolLM2-135M, the shipped EAGLE drafter
    python -m specdec.run drafter=draft_model drafter.k=2 sampling=sample
    python -m specdec.run -m drafter=ngram drafter.k=1,2,4,8   # a sweep (summary written at the end)

Speculative and plain decoding run on the same prompts in the same process, batch by batch in
alternation so slow drifts in machine load hit both alike. Writes ``results.json`` in the run directory.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig
from tqdm import tqdm

from specdec.config import config_dir, register_configs
from specdec.decode.engine import autoregressive_generate, speculative_generate
from specdec.decode.metrics import DecodeStats, predicted_speedup
from specdec.decode.speed_of_light import speed_of_light
from specdec.drafters import build_drafter
from specdec.jobs.data import encode_prompts, left_pad, load_prompt_mix, prompt_room
from specdec.jobs.io import write_json
from specdec.jobs.runs import check_job_config, config_fields, machine_description, run_task
from specdec.models import target_decoder
from specdec.models.graphs import check_compile_mode
from specdec.models.llama import use_coded_panels
from specdec.models.loading import load_target, resolve_device, stop_token_ids
from specdec.verify.sampling import SamplingParams

register_configs()


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan  # no decode steps (max_new_tokens=1): no decode-only rate


def summarize(spec: DecodeStats, base: DecodeStats | None, k: int, num_prompts: int) -> dict[str, Any]:
    """The metrics of results.json for one group of prompts (all of them, or one category).

    Rates and speedups come twice (:mod:`specdec.decode.metrics`): ``tokens_per_second``,
    ``baseline_tokens_per_second`` and ``speedup`` end to end, the prompt's prefill included (as they always
    were); ``decode_tokens_per_second``, ``baseline_decode_tokens_per_second`` and ``decode_speedup`` decode
    only, the prefill's time and its token left out (on long prompts the prefill can take most of the time).
    Two predictions of the speedup: ``predicted_speedup_measured_costs`` (the table's ``predicted`` column) holds
    for any proposal shape; ``predicted_speedup`` is Leviathan et al.'s formula, which assumes a chain of k drafts
    (``drafting`` says which shape the drafter proposed) verified at a plain step's cost."""
    out = {
        "num_prompts": num_prompts,
        "acceptance_rate": spec.acceptance_rate,
        "acceptance_rate_conditional": spec.acceptance_rate_conditional,
        "acceptance_per_position": spec.acceptance_per_position,
        "mean_accepted_length": spec.mean_accepted_length,
        "tokens_per_second": spec.tokens_per_second,
        "baseline_tokens_per_second": math.nan,
        "speedup": math.nan,
        "decode_tokens_per_second": spec.decode_tokens_per_second,
        "baseline_decode_tokens_per_second": math.nan,
        "decode_speedup": math.nan,
        "predicted_speedup": math.nan,
        "predicted_speedup_measured_costs": math.nan,
        "drafting": "tree" if spec.tree_steps else "chain",
        "cost_ratio": math.nan,
    }
    if base is not None and base.target_forwards:
        step_time = base.target_time_s / base.target_forwards
        cost = spec.cost_ratio(step_time)
        per_step = spec.target_time_per_forward + (spec.drafter_time_s / spec.target_forwards
                                                   if spec.target_forwards else math.nan)
        out.update(
            baseline_tokens_per_second=base.tokens_per_second,
            speedup=_ratio(spec.tokens_per_second, base.tokens_per_second),
            baseline_decode_tokens_per_second=base.decode_tokens_per_second,
            decode_speedup=_ratio(spec.decode_tokens_per_second, base.decode_tokens_per_second),
            cost_ratio=cost,
            # Leviathan et al.'s formula: a chain of k drafts, verification costing one target step.
            predicted_speedup=predicted_speedup(spec.acceptance_rate_conditional, k, cost),
            # The prediction from measured costs (any proposal shape, verification at its real cost):
            # τ · plain step time / (verify + draft time per step). Its gap to the measured speedup is loop
            # overhead; for a chain, its gap to predicted_speedup is the cost of verifying k+1 tokens.
            predicted_speedup_measured_costs=spec.mean_accepted_length * step_time / per_step,
            target_step_time_s=step_time,
            verify_step_time_s=spec.target_time_per_forward,
        )
    return out


def run(cfg: DictConfig) -> dict[str, Any]:
    check_job_config(cfg)
    k = cfg.drafter.k
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"drafter.k (lookahead) must be an integer >= 1, got {k!r}")
    sampling = dict(temperature=cfg.sampling.temperature, top_k=cfg.sampling.top_k, top_p=cfg.sampling.top_p)
    SamplingParams(**sampling)  # bad settings fail before the model loads
    check_compile_mode(cfg.target.compile)
    prompt_room(cfg.data.max_new_tokens, k, cfg.target.max_context, "target.max_context")
    torch.manual_seed(cfg.sampling.seed)
    device = resolve_device(cfg.target.device)
    use_coded_panels(cfg.target.coded_weights)
    target, tokenizer = load_target(cfg.target.name, dtype=cfg.target.dtype, device=device)
    drafter = build_drafter(cfg.drafter, target, tokenizer)
    decoder = target_decoder(target, cfg.target.compile)  # what the target's forwards run through
    drafter.replay_graphs(cfg.target.compile)  # and the drafter's own model, where it runs one

    context = min(cfg.target.max_context, target.config.max_position_embeddings)
    limit = prompt_room(cfg.data.max_new_tokens, k, context,
                       "target.max_context" if context == cfg.target.max_context else "max_position_embeddings")
    if cfg.data.max_prompt_tokens is not None:
        limit = min(limit, cfg.data.max_prompt_tokens)
    rows = load_prompt_mix(list(cfg.data.sources), cfg.data.limit_per_source, seed=cfg.sampling.seed)
    prompts = encode_prompts(tokenizer, rows, limit, context)
    eos = stop_token_ids(target, tokenizer)
    generator = torch.Generator(device=device)
    gen_args = dict(max_new_tokens=cfg.data.max_new_tokens, eos_token_id=eos, generator=generator, **sampling)

    if cfg.warmup:  # one-off costs (allocator, kernels' first calls) stay out of the timings
        ids, mask = left_pad(prompts[:1], tokenizer.pad_token_id, device)
        speculative_generate(decoder, drafter, ids, attention_mask=mask, k=k, **{**gen_args, "max_new_tokens": 8})
        autoregressive_generate(decoder, ids, attention_mask=mask, **{**gen_args, "max_new_tokens": 8})

    by_category: dict[str, list[DecodeStats]] = defaultdict(list)
    base_by_category: dict[str, list[DecodeStats]] = defaultdict(list)
    mismatches = 0
    bs = cfg.data.batch_size
    for start in tqdm(range(0, len(prompts), bs), desc=f"{cfg.drafter.name} k={k}", unit="batch"):
        batch_rows = rows.select(range(start, min(start + bs, len(prompts))))
        ids, mask = left_pad(prompts[start:start + bs], tokenizer.pad_token_id, device)
        generator.manual_seed(cfg.sampling.seed + start)
        spec = speculative_generate(decoder, drafter, ids, attention_mask=mask, k=k, **gen_args)
        category = batch_rows[0]["category"] if bs == 1 else "mixed"
        by_category[category].append(spec.stats)
        if cfg.baseline:
            generator.manual_seed(cfg.sampling.seed + start)
            base = autoregressive_generate(decoder, ids, attention_mask=mask, **gen_args)
            base_by_category[category].append(base.stats)
            if cfg.sampling.temperature == 0:
                mismatches += sum(a != b for a, b in zip(spec.sequences, base.sequences))

    def total(groups):
        merged = None
        for stats in groups:
            merged = stats if merged is None else merged.merge(stats)
        return merged

    spec_all = total(s for group in by_category.values() for s in group)
    base_all = total(s for group in base_by_category.values() for s in group) if cfg.baseline else None
    results = {
        "status": "ok",
        "error": None,
        **config_fields(cfg),
        "num_prompts": len(prompts),
        **summarize(spec_all, base_all, k, len(prompts)),
        "target_forwards": spec_all.target_forwards,
        "drafter_forwards": spec_all.drafter_forwards,
        "new_tokens": spec_all.new_tokens,
        "wall_time_s": spec_all.wall_time_s,  # end to end, the prefill included
        "baseline_wall_time_s": base_all.wall_time_s if base_all else math.nan,
        "prefill_time_s": spec_all.prefill_time_s,  # the target's forwards over the prompts, part of wall_time_s
        "baseline_prefill_time_s": base_all.prefill_time_s if base_all else math.nan,
        "per_category": {
            cat: summarize(total(group), total(base_by_category[cat]) if cfg.baseline else None, k, len(group) * bs)
            for cat, group in sorted(by_category.items())
        },
        "greedy_mismatches": mismatches if cfg.baseline and cfg.sampling.temperature == 0 else None,
        "lossy": drafter.lossy,
        "cuda_graph_captures": getattr(decoder, "captures", None),  # None: eager forwards
        "cuda_graph_capture_time_s": getattr(decoder, "capture_time_s", None),  # left out of the timings above
        **drafter_graph_fields(drafter),
        "device": machine_description(device),
    }
    if "target_step_time_s" in results:  # plain decoding ran: the steps' times against the bandwidth floor
        context = (sum(map(len, prompts)) + spec_all.new_tokens / 2) / len(prompts)  # mean tokens attended
        results.update(speed_of_light(target, context, bs, results["target_step_time_s"],
                                      results["verify_step_time_s"], device))
    return results


def drafter_graph_fields(drafter) -> dict[str, Any]:
    """The drafter's own graphs (:meth:`~specdec.drafters.base.Drafter.graph_runners`): how many shapes were captured
    and the seconds that took (the warm-up's included), left out of the timings as the target's are; None where its
    work ran eagerly."""
    runners = drafter.graph_runners()
    return {"drafter_graph_captures": sum(r.captures for r in runners) if runners else None,
            "drafter_graph_capture_time_s": sum(r.capture_time_s for r in runners) if runners else None}


def format_table(results: dict[str, Any]) -> str:
    # predicted: from measured costs, which fits trees as well as chains (Leviathan's formula, under the table,
    # assumes a chain verified at a plain step's cost); like decode only, it leaves the prefill out
    rates = f"{'tok/s':>9}{'base tok/s':>12}{'speedup':>9}"
    head = f"{'category':<14}{'prompts':>8}{'α':>8}{'τ':>8}{rates}{rates}{'predicted':>11}"
    groups = f"{'':<38}{'end to end (with prefill)':^30}{'decode only (no prefill)':^30}"
    lines = [groups.rstrip(), head, "-" * len(head)]
    rows = list(results["per_category"].items()) + [("ALL", results)]
    for name, r in rows:
        lines.append(
            f"{name:<14}{r['num_prompts']:>8}{r['acceptance_rate']:>8.3f}{r['mean_accepted_length']:>8.2f}"
            f"{r['tokens_per_second']:>9.1f}{r['baseline_tokens_per_second']:>12.1f}{r['speedup']:>8.2f}x"
            f"{r['decode_tokens_per_second']:>9.1f}{r['baseline_decode_tokens_per_second']:>12.1f}"
            f"{r['decode_speedup']:>8.2f}x{r['predicted_speedup_measured_costs']:>10.2f}x"
        )
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
    if results.get("greedy_mismatches") is not None:
        lines.append(f"greedy outputs identical to plain decoding: {results['greedy_mismatches'] == 0} "
                     f"({results['greedy_mismatches']} mismatching rows)")
    return "\n".join(lines)


def _main(cfg: DictConfig, results_path: Path) -> float:
    results = run(cfg)
    write_json(results_path, results)
    print(format_table(results))
    print(f"results: {results_path}")
    if cfg.logger.name == "wandb":
        from specdec.report import wandb_log_run

        wandb_log_run(cfg, results, results_path.parent)
    return results["speedup"]


@hydra.main(config_path=config_dir(), config_name="run", version_base="1.3")
def main(cfg: DictConfig) -> float:
    return run_task(cfg, _main, failure_value=math.nan)  # the speedup, which a sweep maximises


if __name__ == "__main__":
    main()
