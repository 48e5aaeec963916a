"""Main job: speculative vs plain decoding of one configuration on a real prompt set.

    python -m specdec.run                                  # embedded SmolLM2-135M, prompt lookup, k=auto
    python -m specdec.run drafter=draft_model drafter.k=2 sampling=sample
    python -m specdec.run -m drafter=ngram drafter.k=1,2,4,8   # a sweep (summary written at the end)
    python -m specdec.run drafter.k=4 data.batch_size=4        # a fixed lookahead (default auto: chosen per run)

Speculative and plain decoding run on the same prompts in the same process, batch by batch in
alternation so slow drifts in machine load hit both alike (plain decoding first in every other batch: the first of
two runs over a batch is the slower). Each prompt's figures are kept (``per_prompt``), and
every speedup comes with its 95% bootstrap interval over the prompts it rests on; a category of fewer than 3
prompts is marked (``few_prompts``). Writes ``results.json`` in the run directory.

``drafter.k=auto`` chooses the lookahead before decoding (:mod:`specdec.replay.auto`: a replay of held-out
prompts, timed at this batch size on this machine; its settings are checked and its prompts read and encoded with the
job's, :meth:`~specdec.jobs.job.Job.build`), down to none: k = 0 decodes plainly, once, and that run is
both sides (1.00x: timing plain decoding against itself would measure only the machine's noise, ±10% at batch 8
here). ``results.json`` keeps the choice and its predictions under ``auto``.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig
from tqdm import tqdm

from specdec.config import config_dir, register_configs
from specdec.decode.engine import GenerationOutput, autoregressive_generate, speculative_generate
from specdec.decode.metrics import DecodeStats, summarize_prompts, total
from specdec.decode.speed_of_light import speed_of_light
from specdec.drafters.base import graph_runners
from specdec.jobs.data import left_pad, result_category
from specdec.jobs.io import write_json
from specdec.jobs.job import Job
from specdec.jobs.runs import config_fields, machine_description, run_task
from specdec.models.backend import Backend
from specdec.replay.auto import AutoChoice, choose_lookahead
from specdec.report.table import format_table

register_configs()
log = logging.getLogger(__name__)


def run(cfg: DictConfig, backend: Backend | None = None) -> dict[str, Any]:
    """The main job: ``cfg``'s drafter against plain decoding on its prompts; the results.json fields. The target
    and the drafter run on ``backend`` (None: the one ``cfg.target`` names,
    :func:`~specdec.jobs.job.target_backend`)."""
    job = Job.build(cfg, backend=backend)  # k=auto: the drafter is built at the largest size it tries
    decoder = job.decoder(graphs=True)  # what the target's forwards run through
    if job.drafter.runtime is not None:  # and the drafter's own model, where it runs one
        job.drafter.runtime.replay_graphs(job.compile)
    choice = choose_auto(job, decoder) if job.auto else None
    sides = Sides(job, decoder, choice.k if choice else job.k)
    if cfg.warmup:  # one-off costs (allocator, kernels' first calls) stay out of the timings
        sides.warm_up()
    decoded = decode_prompts(sides, baseline=cfg.baseline,
                             desc=f"{cfg.drafter.name} k={sides.k}{' (auto)' if choice else ''}")
    return {"status": "ok", "error": None, **config_fields(cfg), **results(decoded, sides, choice)}


@dataclass
class Sides:
    """The two sides of the main job: speculative decoding at lookahead ``k`` (plain decoding where k=auto chose none,
    k = 0) and plain decoding, through one decoder, each generation seeded."""

    job: Job
    decoder: torch.nn.Module
    k: int
    generator: torch.Generator = field(init=False)

    def __post_init__(self):
        self.generator = torch.Generator(device=self.job.device)

    def generate(self, ids: torch.Tensor, mask: torch.Tensor, seed: int, *, plain: bool = False,
                 max_new_tokens: int | None = None) -> GenerationOutput:  # ids, mask [B, S]
        """A batch of the job's prompts (``ids``, left-padded) decoded speculatively, or plainly with ``plain`` (and
        where k = 0), the generator seeded with ``seed``."""
        self.generator.manual_seed(seed)
        options = dict(attention_mask=mask, max_new_tokens=max_new_tokens or self.job.max_new_tokens,
                       eos_token_id=self.job.eos, generator=self.generator, **asdict(self.job.sampling))
        if plain or self.k == 0:
            return autoregressive_generate(self.decoder, ids, **options)
        return speculative_generate(self.decoder, self.job.drafter, ids, k=self.k, **options)

    def warm_up(self) -> None:
        """A short generation of the first prompt on each side, untimed: one-off costs (the allocator, kernels' first
        calls) stay out of the timings."""
        ids, mask = left_pad(self.job.prompts[:1], self.job.pad_id, self.job.device)
        self.generate(ids, mask, self.job.seed, max_new_tokens=8)
        self.generate(ids, mask, self.job.seed, plain=True, max_new_tokens=8)


@dataclass
class Decoded:
    """The main job's generations' statistics by category of prompts (one entry a batch), plain decoding's too
    (``baseline``), each batch's figures (:func:`prompt_figures`) and the greedy outputs that differ."""

    spec: dict[str, list[DecodeStats]] = field(default_factory=lambda: defaultdict(list))
    base: dict[str, list[DecodeStats]] | None = None
    per_prompt: list[dict[str, Any]] = field(default_factory=list)
    mismatches: int | None = None


def decode_prompts(sides: Sides, *, baseline: bool, desc: str) -> Decoded:
    """The job's prompts decoded batch by batch, both sides alike (plain decoding only with ``baseline``)."""
    job, k, bs = sides.job, sides.k, sides.job.batch_size
    decoded = Decoded(base=defaultdict(list) if baseline else None,
                      mismatches=0 if baseline and job.sampling.greedy else None)
    for start in tqdm(range(0, len(job.prompts), bs), desc=desc, unit="batch"):
        rows = job.rows.select(range(start, min(start + bs, len(job.prompts))))
        ids, mask = left_pad(job.prompts[start:start + bs], job.pad_id, job.device)
        seed = job.seed + start  # the plain side seeded as the speculative side is
        # every other batch plain decoding runs first: the first of two runs over a batch is the slower (5% at
        # batch 4 on a 2-core EPYC, plain decoding against itself: experiments/README.md#heldout-2026-11-27)
        base = sides.generate(ids, mask, seed, plain=True) if baseline and ((start // bs) % 2 or k == 0) else None
        spec = base if k == 0 and base is not None else sides.generate(ids, mask, seed)  # k=0: one run (1.00x)
        category = result_category(rows[0]) if bs == 1 else "mixed"
        decoded.spec[category].append(spec.stats)
        if baseline:
            base = sides.generate(ids, mask, seed, plain=True) if base is None else base
            decoded.base[category].append(base.stats)
            decoded.per_prompt.append(prompt_figures(rows["id"], category, spec.stats, base.stats))
            if decoded.mismatches is not None:  # greedy: the outputs must be plain decoding's
                decoded.mismatches += sum(a != b for a, b in zip(spec.sequences, base.sequences))
    return decoded


def results(decoded: Decoded, sides: Sides, choice: AutoChoice | None) -> dict[str, Any]:
    """results.json's figures for the ``decoded`` prompts (the config fields aside)."""
    job, bs = sides.job, sides.job.batch_size
    spec_runs = [s for group in decoded.spec.values() for s in group]
    base_runs = [s for group in decoded.base.values() for s in group] if decoded.base is not None else None
    spec_all, base_all = total(spec_runs), total(base_runs) if base_runs is not None else None
    k = spec_runs[0].k if spec_runs else sides.k  # as decoded: a chain's k is capped at the tokens a prompt can use
    figures = {
        "num_prompts": len(job.prompts),
        **summarize_prompts(spec_runs, base_runs, k, len(job.prompts)),
        "target_forwards": spec_all.target_forwards,
        "drafter_forwards": spec_all.drafter_forwards,
        "new_tokens": spec_all.new_tokens,
        "wall_time_s": spec_all.wall_time_s,  # end to end, the prefill included
        "baseline_wall_time_s": base_all.wall_time_s if base_all else math.nan,
        "prefill_time_s": spec_all.prefill_time_s,  # the target's forwards over the prompts, part of wall_time_s
        "baseline_prefill_time_s": base_all.prefill_time_s if base_all else math.nan,
        "per_category": {
            cat: summarize_prompts(group, decoded.base[cat] if decoded.base is not None else None, k, len(group) * bs)
            for cat, group in sorted(decoded.spec.items())
        },
        "per_prompt": decoded.per_prompt,  # a batch's prompts per entry: one prompt each at data.batch_size=1
        "greedy_mismatches": decoded.mismatches,
        "lossy": job.drafter.traits.lossy,
        "k_chosen": k,  # the lookahead decoded with (drafter.k, or what auto chose: 0 = plain decoding)
        "auto": choice.as_dict() if choice else None,
        "cuda_graph_captures": getattr(sides.decoder, "captures", None),  # None: eager forwards
        "cuda_graph_capture_time_s": getattr(sides.decoder, "capture_time_s", None),  # left out of the timings above
        **drafter_graph_fields(job.drafter),
        "device": machine_description(job.device),
    }
    if "target_step_time_s" in figures:  # plain decoding ran: the steps' times against the bandwidth floor
        context = (sum(map(len, job.prompts)) + spec_all.new_tokens / 2) / len(job.prompts)  # mean tokens attended
        figures.update(speed_of_light(job.target, context, bs, figures["target_step_time_s"],
                                      figures["verify_step_time_s"], job.device, job.backend))
    return figures


def choose_auto(job: Job, decoder: Any = None) -> AutoChoice:
    """drafter.k=auto's choice for ``job`` (:func:`~specdec.replay.auto.choose_lookahead`, with its checked settings)
    on its held-out prompts, on the job's backend: logged through the target's eager forwards, timed through
    ``decoder``, what the run decodes through (None: the job's, ``job.decoder(graphs=True)``: the graphs a GPU
    replays, as ``target.compile`` says)."""
    choice = choose_lookahead(job.decoder(), job.drafter, job.calibration, job.auto, batch_size=job.batch_size,
                              eos=job.eos, tokenizer=job.tokenizer, sampling=job.sampling,
                              run_tokens=job.max_new_tokens, timing=decoder or job.decoder(graphs=True))
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
    """The drafter's own graphs (:func:`~specdec.drafters.base.graph_runners`): how many shapes were captured
    and the seconds that took (the warm-up's included), left out of the timings as the target's are; None where its
    work ran eagerly."""
    runners = graph_runners(drafter)
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
