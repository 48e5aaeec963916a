"""Main job: speculative vs plain decoding of one configuration on a real prompt set.

    python -m specdec.run                                  # embedded SmolLM2-135M, prompt lookup (n-gram, K=4)
    python -m specdec.run drafter=draft_model drafter.k=2 sampling=sample
    python -m specdec.run -m drafter=ngram drafter.k=1,2,4,8   # a sweep (summary written at the end)
    python -m specdec.run drafter.k=auto data.batch_size=4     # the lookahead chosen for this machine and batch

Speculative and plain decoding run on the same prompts in the same process, batch by batch in
alternation so slow drifts in machine load hit both alike (plain decoding first in every other batch: the first of
two runs over a batch is the slower). Each prompt's figures are kept (``per_prompt``), and
every speedup comes with its 95% bootstrap interval over the prompts it rests on; a category of fewer than 3
prompts is marked (``few_prompts``). Writes ``results.json`` in the run directory.

``drafter.k=auto`` chooses the lookahead before decoding (:mod:`specdec.replay.auto`: a replay of held-out
prompts, timed at this batch size on this machine), down to none: k = 0 decodes plainly, once, and that run is
both sides (1.00x: timing plain decoding against itself would measure only the machine's noise, ±10% at batch 8
here). ``results.json`` keeps the choice and its predictions under ``auto``.
"""

from __future__ import annotations

import logging
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
from specdec.decode.metrics import DecodeStats, summarize_prompts, total
from specdec.decode.speed_of_light import speed_of_light
from specdec.drafters import build_drafter
from specdec.jobs.checks import check_auto, check_before_loading, check_lookahead
from specdec.jobs.data import encode_prompts, held_out_mix, left_pad, prompt_room, result_category
from specdec.jobs.io import write_json
from specdec.jobs.runs import config_fields, machine_description, run_task, target_backend
from specdec.models import as_decoder, target_decoder
from specdec.models.backend import Backend
from specdec.models.loading import load_target, resolve_device, stop_token_ids
from specdec.replay.auto import CHAIN_KS, TREE_SIZES, AutoChoice, auto_candidates, choose_lookahead
from specdec.report.table import format_table

register_configs()
log = logging.getLogger(__name__)


def run(cfg: DictConfig, backend: Backend | None = None) -> dict[str, Any]:
    """The main job: ``cfg``'s drafter against plain decoding on its prompts; the results.json fields. The target
    and the drafter run on ``backend`` (None: the one ``cfg.target`` names, :func:`target_backend`)."""
    auto, tree = cfg.drafter.k == "auto", bool(cfg.drafter.get("tree"))
    check_lookahead(cfg.drafter.k, auto=True)
    if auto:
        check_auto(cfg.auto)
    k = max(cfg.auto.ks or (TREE_SIZES if tree else CHAIN_KS)) if auto else cfg.drafter.k  # auto: built at its largest
    rows = check_before_loading(cfg, k)  # every refusal that needs no model, before the target loads
    sampling = dict(temperature=cfg.sampling.temperature, top_k=cfg.sampling.top_k, top_p=cfg.sampling.top_p)
    torch.manual_seed(cfg.sampling.seed)
    device = resolve_device(cfg.target.device)
    backend = target_backend(cfg.target) if backend is None else backend
    target, tokenizer = load_target(cfg.target.name, dtype=cfg.target.dtype, device=device)
    drafter = build_drafter({**cfg.drafter, "k": k}, target, tokenizer, backend)
    decoder = target_decoder(target, cfg.target.compile, backend=backend)  # what the target's forwards run through
    drafter.replay_graphs(cfg.target.compile)  # and the drafter's own model, where it runs one

    context = min(cfg.target.max_context, target.config.max_position_embeddings)
    limit = prompt_room(cfg.data.max_new_tokens, k, context,
                       "target.max_context" if context == cfg.target.max_context else "max_position_embeddings")
    if cfg.data.max_prompt_tokens is not None:
        limit = min(limit, cfg.data.max_prompt_tokens)
    prompts = encode_prompts(tokenizer, rows, limit, context)
    eos = stop_token_ids(target, tokenizer)
    # k=auto times the target's eager forwards, on the job's backend
    choice = choose_auto(cfg, as_decoder(target, backend=backend), drafter, tokenizer, tree, eos, limit,
                         context) if auto else None
    k = choice.k if choice else k
    generator = torch.Generator(device=device)
    gen_args = dict(max_new_tokens=cfg.data.max_new_tokens, eos_token_id=eos, generator=generator, **sampling)

    def generate(ids, mask, **options):  # speculative decoding, or plain where k=auto chose none
        if k == 0:
            return autoregressive_generate(decoder, ids, attention_mask=mask, **options)
        return speculative_generate(decoder, drafter, ids, attention_mask=mask, k=k, **options)

    if cfg.warmup:  # one-off costs (allocator, kernels' first calls) stay out of the timings
        ids, mask = left_pad(prompts[:1], tokenizer.pad_token_id, device)
        generate(ids, mask, **{**gen_args, "max_new_tokens": 8})
        autoregressive_generate(decoder, ids, attention_mask=mask, **{**gen_args, "max_new_tokens": 8})

    by_category: dict[str, list[DecodeStats]] = defaultdict(list)
    base_by_category: dict[str, list[DecodeStats]] = defaultdict(list)
    per_prompt: list[dict[str, Any]] = []
    mismatches = 0
    bs = cfg.data.batch_size
    for start in tqdm(range(0, len(prompts), bs), desc=f"{cfg.drafter.name} k={k}{' (auto)' if auto else ''}",
                      unit="batch"):
        batch_rows = rows.select(range(start, min(start + bs, len(prompts))))
        ids, mask = left_pad(prompts[start:start + bs], tokenizer.pad_token_id, device)
        def plain():  # seeded as the speculative side is
            generator.manual_seed(cfg.sampling.seed + start)
            return autoregressive_generate(decoder, ids, attention_mask=mask, **gen_args)

        # every other batch plain decoding runs first: the first of two runs over a batch is the slower (5% at
        # batch 4 on a 2-core EPYC, plain decoding against itself: experiments/README.md#heldout-2026-11-27)
        base = plain() if cfg.baseline and ((start // bs) % 2 or k == 0) else None
        if k == 0 and base is not None:  # k=auto chose plain decoding: both sides are this one run (1.00x)
            spec = base
        else:
            generator.manual_seed(cfg.sampling.seed + start)
            spec = generate(ids, mask, **gen_args)
        category = result_category(batch_rows[0]) if bs == 1 else "mixed"
        by_category[category].append(spec.stats)
        if cfg.baseline:
            if base is None:
                base = plain()
            base_by_category[category].append(base.stats)
            per_prompt.append(prompt_figures(batch_rows["id"], category, spec.stats, base.stats))
            if cfg.sampling.temperature == 0:
                mismatches += sum(a != b for a, b in zip(spec.sequences, base.sequences))

    spec_runs = [s for group in by_category.values() for s in group]
    base_runs = [s for group in base_by_category.values() for s in group] if cfg.baseline else None
    spec_all, base_all = total(spec_runs), total(base_runs) if cfg.baseline else None
    k = spec_runs[0].k if spec_runs else k  # as decoded: a chain's k is capped at the tokens a prompt can use
    results = {
        "status": "ok",
        "error": None,
        **config_fields(cfg),
        "num_prompts": len(prompts),
        **summarize_prompts(spec_runs, base_runs, k, len(prompts)),
        "target_forwards": spec_all.target_forwards,
        "drafter_forwards": spec_all.drafter_forwards,
        "new_tokens": spec_all.new_tokens,
        "wall_time_s": spec_all.wall_time_s,  # end to end, the prefill included
        "baseline_wall_time_s": base_all.wall_time_s if base_all else math.nan,
        "prefill_time_s": spec_all.prefill_time_s,  # the target's forwards over the prompts, part of wall_time_s
        "baseline_prefill_time_s": base_all.prefill_time_s if base_all else math.nan,
        "per_category": {
            cat: summarize_prompts(group, base_by_category[cat] if cfg.baseline else None, k, len(group) * bs)
            for cat, group in sorted(by_category.items())
        },
        "per_prompt": per_prompt,  # a batch's prompts per entry: one prompt each at data.batch_size=1
        "greedy_mismatches": mismatches if cfg.baseline and cfg.sampling.temperature == 0 else None,
        "lossy": drafter.lossy,
        "k_chosen": k,  # the lookahead decoded with (drafter.k, or what auto chose: 0 = plain decoding)
        "auto": choice.as_dict() if choice else None,
        "cuda_graph_captures": getattr(decoder, "captures", None),  # None: eager forwards
        "cuda_graph_capture_time_s": getattr(decoder, "capture_time_s", None),  # left out of the timings above
        **drafter_graph_fields(drafter),
        "device": machine_description(device),
    }
    if "target_step_time_s" in results:  # plain decoding ran: the steps' times against the bandwidth floor
        context = (sum(map(len, prompts)) + spec_all.new_tokens / 2) / len(prompts)  # mean tokens attended
        results.update(speed_of_light(target, context, bs, results["target_step_time_s"],
                                      results["verify_step_time_s"], device, backend))
    return results


def choose_auto(cfg: DictConfig, target, drafter, tokenizer, tree: bool, eos: list[int], limit: int,
                context: int) -> AutoChoice:
    """drafter.k=auto's choice for this run (:func:`~specdec.replay.auto.choose_lookahead`) on held-out prompts of
    its sources (cfg.auto), timed through the target's eager forwards (a GPU's graphs are not replayed there)."""
    rows, held_out = held_out_mix(list(cfg.data.sources), cfg.data.limit_per_source, cfg.auto.prompts_per_source,
                                  seed=cfg.sampling.seed)
    if not held_out:
        log.warning("drafter.k=auto: data.sources leave no prompts out of the run; choosing on the run's own first "
                    "%d per source", cfg.auto.prompts_per_source)
    candidates = auto_candidates(drafter, tree, cfg.auto.ks)
    choice = choose_lookahead(target, drafter, encode_prompts(tokenizer, rows, limit, context), tree=tree,
                              candidates=candidates, batch_size=cfg.data.batch_size,
                              max_new_tokens=cfg.auto.max_new_tokens, eos=eos, tokenizer=tokenizer,
                              temperature=cfg.sampling.temperature, top_k=cfg.sampling.top_k,
                              top_p=cfg.sampling.top_p, seeds=cfg.auto.seeds, margin=cfg.auto.margin,
                              directory=cfg.auto.log_dir)
    predicted = ", ".join(f"{k}: {x:.2f}x" for k, x in choice.predicted.items())
    log.info("drafter.k=auto chose k=%d%s in %.1f s (predicted decode speedups %s)", choice.k,
             " (plain decoding)" if choice.k == 0 else "", choice.seconds, predicted)
    return choice


def prompt_figures(ids: list[str], category: str, spec: DecodeStats, base: DecodeStats) -> dict[str, Any]:
    """One entry of results.json's ``per_prompt``: the prompts of one batch (one at data.batch_size=1), their
    category, speedups and what those rest on (each decoding's tokens and times)."""
    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else math.nan

    return {"prompts": list(ids), "category": category,
            "speedup": ratio(spec.tokens_per_second, base.tokens_per_second),
            "decode_speedup": ratio(spec.decode_tokens_per_second, base.decode_tokens_per_second),
            "mean_accepted_length": spec.mean_accepted_length,
            "new_tokens": spec.new_tokens, "wall_time_s": spec.wall_time_s, "prefill_time_s": spec.prefill_time_s,
            "baseline_new_tokens": base.new_tokens, "baseline_wall_time_s": base.wall_time_s,
            "baseline_prefill_time_s": base.prefill_time_s}


def drafter_graph_fields(drafter) -> dict[str, Any]:
    """The drafter's own graphs (:meth:`~specdec.drafters.base.Drafter.graph_runners`): how many shapes were captured
    and the seconds that took (the warm-up's included), left out of the timings as the target's are; None where its
    work ran eagerly."""
    runners = drafter.graph_runners()
    return {"drafter_graph_captures": sum(r.captures for r in runners) if runners else None,
            "drafter_graph_capture_time_s": sum(r.capture_time_s for r in runners) if runners else None}


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
