"""``python -m specdec.replay``: the main job's figures for one configuration, replayed from a logged pass.

    python -m specdec.replay drafter=ngram drafter.k=4
    python -m specdec.replay -m drafter=ngram drafter.k=1,2,4      # mirrors python -m specdec.run -m ...

    python -m specdec.replay sampling=sample drafter=ngram drafter.k=2 seeds=16 check_live=8 live_seeds=16

It composes the main job's groups (target, drafter, sampling, data, logger) and prints a table like the main job's,
marked REPLAYED (:func:`~specdec.report.table.format_replay_table`): α, τ and the per-position acceptance as a live
greedy run gives them (exactly: tests/replay), or at T > 0 their expectation along ``seeds`` sampled continuations per
prompt (:mod:`specdec.replay.simulate`; with deterministic drafts also τ of the matching walk, exact in
distribution), and one figure of speed: the decode speedup the measured cost model predicts (``predicted_speedup``:
decode only, the loop's host work included, :mod:`specdec.replay.costs`; :func:`~specdec.decode.metrics.as_replayed`),
at this point's K and, for chains, at every K the log covers (``predicted_speedup_by_k``, the best marked in the
table). The first point logs the target's continuations and the drafter's proposals (chains up to ``k_max`` drafts,
a tree at its ``k``) and measures the costs; the file is kept under ``log_dir`` and every later point it covers
reuses it. ``check_live: N`` decodes the first N prompts live as well (``live_seeds`` runs each at T > 0) and
reports τ's gap (results: ``live_check``). The log holds one prompt per generation; ``data.batch_size=B`` times the
replay by a cost model measured at B rows, each row accepting as it would alone, and (the overall and per-K figures)
its rows stepping together in batches of B as a live run's do (:func:`~specdec.replay.simulate.batched_speedup`: each
step as wide as its widest row's block, each batch as long as its slowest row; no interval, since a batch's time does
not split into prompts); the per-category figures time each row alone at B rows' costs. ``costs=<a step-cost
curve>`` (``experiments/benchmarks/step_costs.py``'s JSON) times the replay by another machine's or model size's
verify steps instead (results: ``costs_from``), and the drafter's steps by the curve's rows for it where it has them
(``--drafters``: a PREDICTED speedup, the loop's host work left out; results: ``drafting_from_curve`` says how),
else counted free (n-gram lookup, whose step is host work; a curve without them): an upper bound.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

import hydra
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from specdec.config import JobConfig, config_dir, job_defaults, register_configs
from specdec.decode.engine import speculative_generate
from specdec.decode.metrics import DecodeStats, as_replayed, summarize_prompts, total
from specdec.drafters.loading import lossy_rule
from specdec.jobs.checks import check_log_dir, check_lookahead
from specdec.jobs.data import result_category
from specdec.jobs.io import write_json
from specdec.jobs.job import Job
from specdec.jobs.runs import config_fields, machine_description, run_task
from specdec.replay.cache import cached_log
from specdec.replay.costs import CostModel
from specdec.replay.log import ReplayLog, drafts_trees
from specdec.replay.simulate import batched_speedup, plain_stats, replay
from specdec.report.table import format_replay_table


@dataclass
class ReplayConfig(JobConfig):
    defaults: list[Any] = field(default_factory=lambda: job_defaults("greedy", "eagle"))  # a learned drafter's K sweep
    k_max: int = 8  # chains are logged up to max(drafter.k, k_max) drafts, so a K sweep shares one log
    seeds: int = 4  # T > 0: sampled continuations logged per prompt (seeds sampling.seed + 0 .. seeds - 1)
    check_live: int = 0  # decode the first N prompts live at this point too and report τ's gap (results: live_check)
    live_seeds: int = 8  # T > 0: live runs per prompt checked (generator seeds sampling.seed + 1000 s + prompt index)
    log_dir: Optional[str] = None  # where logs are kept; null = replay/ under specdec's cache ($SPECDEC_CACHE)
    # true: measure the cost model here (verify time per width, live steps per K) for the speedups; false: none; or a
    # step-cost curve (experiments/benchmarks/step_costs.py's JSON: another machine's, another model size's) to time
    # the replay by, the drafter's steps from its rows for the drafter (--drafters), else counted free (an upper bound)
    costs: Any = True
    results_file: str = "results.json"


register_configs()
ConfigStore.instance().store(name="replay_schema", node=ReplayConfig)


def check_replay_config(cfg: DictConfig) -> tuple[int, int]:
    """Refuse, before the target loads, what replay does not cover yet (the job's own checks follow in
    :meth:`~specdec.jobs.job.Job.build`); the lookahead k and the one the prompts leave room for (the log's)."""
    k = cfg.drafter.k
    check_lookahead(k, hint="a replay sweeps K itself (-m drafter.k=1,2,4); drafter.k=auto is the main job's "
                            "(python -m specdec.run drafter.k=auto)")
    for name, low in (("seeds", 1), ("check_live", 0), ("live_seeds", 1), ("k_max", 1)):
        value = cfg[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if lossy_rule(cfg.drafter) is not None:
        raise ValueError(f"drafter.acceptance={lossy_rule(cfg.drafter)} is a lossy rule; replay models the exact rule "
                         f"only: use drafter.acceptance=exact")
    check_log_dir(cfg.log_dir, "log_dir")
    return k, 2 * (k if cfg.drafter.get("tree") else max(k, cfg.k_max))  # the log's margin


def run(cfg: DictConfig) -> dict[str, Any]:
    k, room = check_replay_config(cfg)
    curve = cost_curve(cfg)
    job = Job.build(cfg, room=room)
    target = job.decoder()  # eager: what the target's forwards run through
    tree = drafts_trees(job.drafter)
    sampling = asdict(job.sampling)
    log, path, from_disk = cached_log(target, job.drafter, job.prompts, k_max=k if tree else max(k, cfg.k_max),
                                      max_new_tokens=job.max_new_tokens, tokenizer=job.tokenizer, eos_token_id=job.eos,
                                      tree=tree, directory=cfg.log_dir, costs=cfg.costs is True, cost_batch=job.batch_size,
                                      pad_id=job.pad_id, seeds=[job.seed + s for s in range(cfg.seeds)], **sampling)
    if curve:
        curve = curve.drafting_from_curve(cfg.drafter, curve_steps(log, k, tree), at=k)
        log = log.timed_by(curve)
    start = time.perf_counter()
    spec = replay(log, k, batch_size=job.batch_size)
    replay_time = time.perf_counter() - start
    walk = log.temperature != 0 and log.one_hot  # deterministic drafts: the matching walk too
    walked = total(replay(log, k, walk=True)).mean_accepted_length if walk else None
    live = None
    if cfg.check_live:
        live = live_check(target, job.drafter, job.prompts[:cfg.check_live], spec[:cfg.check_live], k=k, eos=job.eos,
                          max_new_tokens=job.max_new_tokens, seeds=1 if log.temperature == 0 else cfg.live_seeds,
                          seed=job.seed, **sampling)
    costs = log.cost_model(job.batch_size)
    return {
        "status": "ok",
        "error": None,
        **config_fields(cfg),
        "num_prompts": len(job.prompts),
        **replayed_figures(log, spec, costs, job.rows, k, batch_size=job.batch_size, tree=tree),
        "greedy_mismatches": None,
        "lossy": False,
        "replayed": True,  # α and τ from the log (greedy: exact; T > 0: expected); rates, prediction: the cost model
        "replay_seeds": log.seeds if log.temperature else None,  # sampled continuations per prompt
        "mean_accepted_length_walk": walked,  # T > 0, deterministic drafts: τ of the matching walk
        "live_check": live,
        "replay_log": str(path),
        "replay_log_reused": from_disk,
        "log_time_s": log.log_time_s,
        "replay_time_s": replay_time,
        "k_max": log.k_max,
        "device": (costs.machine if costs else None) or machine_description(job.device),
        "costs_from": str(cfg.costs) if curve else None,  # a step-cost curve: the speedups are its
        # how the curve's drafter rows timed the drafting steps; None: drafting free (with a curve: upper bounds)
        "drafting_from_curve": (curve.drafting or None) if curve else None,
    }


def curve_steps(log: ReplayLog, k: int, tree: bool) -> dict[int, tuple[float, float | None]]:
    """What a curve's drafting steps are built from at each lookahead (a tree: its k; a chain: every K the log
    covers), from ``log``: τ replayed at that K (the tokens a step commits, which the drafter's next step catches
    up on) and the drafter's own forwards a proposal takes (:meth:`~specdec.replay.log.ReplayLog.draft_forwards`;
    :meth:`~specdec.replay.cost_model.CostModel.drafting_from_curve`)."""
    return {size: (total(replay(log, size)).mean_accepted_length, log.draft_forwards(size))
            for size in ([k] if tree else range(1, log.k_max + 1))}


def cost_curve(cfg: DictConfig) -> CostModel | None:
    """``costs``: true or false (measure here, or not), or a step-cost curve's path, read and checked before any
    model loads (:meth:`~specdec.replay.cost_model.CostModel.from_curve`)."""
    if isinstance(cfg.costs, bool):
        return None
    if not isinstance(cfg.costs, str) or not cfg.costs:
        raise ValueError(f"costs must be true, false or the path of a step-cost curve (step_costs_<shape>.json), got "
                         f"{cfg.costs!r}")
    return CostModel.from_curve(cfg.costs, cfg.data.batch_size)


def replayed_figures(log: ReplayLog, spec: list[DecodeStats], costs: CostModel | None, rows, k: int, *,
                     batch_size: int, tree: bool) -> dict[str, Any]:
    """The main job's figures as the replay of ``log`` at lookahead ``k`` gives them (``spec``: one prompt's
    statistics each, in the order of ``rows``), timed by ``costs`` (None: no speedups): overall, per category, and
    for chains at every K the log covers."""
    base = [plain_stats(s, costs) for s in spec] if costs else None
    by_category: dict[str, list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        by_category[result_category(row)].append(i)

    def group(indices: list[int]) -> tuple[list[DecodeStats], list[DecodeStats] | None]:
        return [spec[i] for i in indices], None if base is None else [base[i] for i in indices]

    figures = as_replayed(summarize_prompts(spec, base, k, len(rows)))
    if costs is not None and batch_size > 1:  # the rows of a batch step together
        figures.update(predicted_speedup=batched_speedup(log, k, batch_size), predicted_speedup_interval=None)
    return {
        **figures,
        "per_category": {cat: as_replayed(summarize_prompts(*group(ids), k, len(ids)))
                         for cat, ids in sorted(by_category.items())},
        # chains: the prediction at every K the log covers (one replay each, milliseconds); a tree's log holds one
        "predicted_speedup_by_k": (None if tree or costs is None else
                                   predicted_by_k(log, range(1, log.k_max + 1), batch_size)),
    }


def predicted_by_k(log: ReplayLog, ks: Iterable[int], batch_size: int) -> dict[str, float]:
    """The decode speedup ``log``'s replay predicts at each lookahead in ``ks`` at a batch of ``batch_size`` rows, as
    ``predicted_speedup`` is (:func:`~specdec.replay.simulate.batched_speedup`), keyed as in JSON."""
    return {str(k): batched_speedup(log, k, batch_size) for k in ks}


def live_check(target, drafter, prompts: list[list[int]], replayed: list[DecodeStats], *, k: int, eos: list[int],
               max_new_tokens: int, seeds: int, seed: int, temperature: float, top_k: int,
               top_p: float) -> dict[str, Any]:
    """``prompts`` decoded live at lookahead ``k`` (``seeds`` runs each at T > 0, the generator seeded
    ``seed + 1000 s + i`` for prompt i: s = 0 is :mod:`specdec.run`'s seeding), against their ``replayed``
    statistics: τ pooled over the prompts (and seeds), and the replay's relative gap."""
    device = next(target.parameters()).device
    generator = torch.Generator(device=device)
    runs, start = [], time.perf_counter()
    for i, prompt in enumerate(prompts):
        for s in range(seeds):
            generator.manual_seed(seed + 1000 * s + i)
            runs.append(speculative_generate(target, drafter, torch.tensor([prompt], device=device), k=k,
                                             max_new_tokens=max_new_tokens, eos_token_id=eos, generator=generator,
                                             temperature=temperature, top_k=top_k, top_p=top_p).stats)
    live, again = total(runs).mean_accepted_length, total(replayed).mean_accepted_length
    taus = [r.mean_accepted_length for r in runs if r.verify_steps]
    spread = statistics.stdev(taus) / math.sqrt(len(taus)) if len(taus) > 1 else math.nan
    return {"prompts": len(prompts), "seeds": seeds, "mean_accepted_length_live": live,
            "live_stderr": spread,  # the standard error of the live runs' mean τ (one τ per run)
            "mean_accepted_length_replayed": again, "gap": again / live - 1.0,
            "live_time_s": time.perf_counter() - start}


def _main(cfg: DictConfig, results_path: Path) -> float:
    results = run(cfg)
    write_json(results_path, results)
    how = ("as a live greedy run's" if results["temperature"] == 0 else
           f"expected over the verifier's draws along {results['replay_seeds']} sampled continuation(s) per prompt")
    print(f"REPLAYED from {results['replay_log']} ({'reused' if results['replay_log_reused'] else 'logged now'}: "
          f"{results['log_time_s']:.1f} s; replay {1000 * results['replay_time_s']:.1f} ms): α and τ {how}; the "
          f"speedup predicted from {'the step-cost curve' if results['costs_from'] else 'the measured cost model'} "
          f"(no prefill)")
    if results["mean_accepted_length_walk"] is not None:
        print(f"τ of the matching walk along the same continuations: {results['mean_accepted_length_walk']:.4f}")
    if results["live_check"]:
        check = results["live_check"]
        print(f"LIVE CHECK: {check['prompts']} prompt(s) x {check['seeds']} seed(s): τ live "
              f"{check['mean_accepted_length_live']:.4f} (± {check['live_stderr']:.4f}), replayed "
              f"{check['mean_accepted_length_replayed']:.4f} (gap {100 * check['gap']:+.2f}%, "
              f"{check['live_time_s']:.1f} s live)")
    print(format_replay_table(results))
    print(f"results: {results_path}")
    return results["predicted_speedup"]


@hydra.main(config_path=config_dir(), config_name="replay", version_base="1.3")
def main(cfg: DictConfig) -> float:
    return run_task(cfg, _main, failure_value=math.nan)


if __name__ == "__main__":
    main()
