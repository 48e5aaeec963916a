"""Is this speculative decoder exact? A statistical test of its sampled outputs, with stated error rates.

    python -m specdec.verify_dist                               # n-gram drafter, K=4, temperature 1.0
    python -m specdec.verify_dist drafter=draft_model sampling.temperature=0.7 sampling.top_p=0.9
    python -m specdec.verify_dist planted_bug=recovered_from_target    # a test of the test: must reject

Exit status: 0 = exactness not rejected, 3 = rejected at ``significance`` (so it can gate CI), 4 = inconclusive
(the run could not have detected any bias), 5 = a lossy drafter (``allow_lossy=true``) not rejected, 1 = the run
failed or was refused. A drafter with a lossy acceptance rule is refused unless ``allow_lossy=true``.
Writes ``verify.json`` and ``verify.png`` in the run directory.

The method (sample, score against the exact conditionals, test, report) is :mod:`specdec.exactness.harness`.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from specdec.config import JobConfig, config_dir, job_defaults, register_configs
from specdec.drafters.loading import lossy_rule
from specdec.exactness import strata
from specdec.exactness.harness import (EXIT_INCONCLUSIVE, EXIT_REJECTED, VerifyResult, check_settings,
                                       verify_distribution)
from specdec.jobs.checks import check_lookahead
from specdec.jobs.io import save_figure, write_json
from specdec.jobs.job import Job
from specdec.jobs.runs import config_fields, machine_description, run_task

log = logging.getLogger(__name__)

EXIT_LOSSY_PASSED = 5  # allow_lossy=true: the lossy drafter was not rejected (too little power to see its bias)

__all__ = ["EXIT_INCONCLUSIVE", "EXIT_LOSSY_PASSED", "EXIT_REJECTED", "VerifyDistConfig", "run", "summary_text",
           "verify_distribution"]


@dataclass
class VerifyDistConfig(JobConfig):  # data: sources × limit_per_source = the M prompts; max_new_tokens = L
    defaults: list[Any] = field(default_factory=lambda: job_defaults("sample", "ngram"))
    samples_per_prompt: int = 32  # N continuations per prompt
    significance: float = 0.01  # family-wise significance level: P(reject | exact) ≤ significance
    alpha: Optional[float] = None  # the old name of significance, still read (with a note); null: not given
    joint_tokens: int = 2  # the two-sample test compares the first j tokens; 0 = skip it (and plain sampling)
    min_rows_per_position: int = 100  # per-position tests need at least this many rows (pooled test always)
    planted_bug: Optional[str] = None  # a name in specdec.exactness.planted.BUGS: a deliberately wrong run (test of the test)
    # pick samples_per_prompt so that a TV bias this large at drafted positions is detected with power 0.9
    # (a pilot measures how often the drafter drafts); null: use samples_per_prompt
    detect_tv: Optional[float] = None
    max_samples_per_prompt: int = 4096  # detect_tv refuses to plan more than this
    plot: bool = True
    # a drafter verifying with a lossy rule (Medusa's typical acceptance) is refused unless this is true; then a run
    # that does not reject it exits with EXIT_LOSSY_PASSED, never 0
    allow_lossy: bool = False
    results_file: str = "verify.json"


register_configs()
ConfigStore.instance().store(name="verify_dist_schema", node=VerifyDistConfig)


def significance_level(cfg: DictConfig) -> float:
    """``cfg.significance``, or the old ``alpha`` where a config still gives it (α is the acceptance rate)."""
    if cfg.get("alpha") is None:
        return cfg.significance
    log.warning("verify_dist's alpha=%s is now called significance (alpha is the acceptance rate elsewhere); "
                "using significance=%s", cfg.alpha, cfg.alpha)
    return cfg.alpha


def check_lossy(cfg: DictConfig) -> bool:
    """Whether the drafter verifies with a lossy rule (Medusa's ``drafter.acceptance=typical``); refused unless
    ``allow_lossy``: this job tests exactness, and a lossy drafter is not exact by design."""
    lossy = lossy_rule(cfg.drafter) is not None
    if lossy and not cfg.allow_lossy:
        raise ValueError(f"drafter.acceptance={cfg.drafter.acceptance} is a LOSSY rule: it changes the output "
                         f"distribution by design, so a PASS would only mean too little power and a CI gate on this "
                         f"job's exit status would pass it; use drafter.acceptance=exact, or add allow_lossy=true to "
                         f"measure its bias (exit status {EXIT_LOSSY_PASSED} where it is not rejected)")
    return lossy


def check_verify_config(cfg: DictConfig) -> float:
    """Refuse, before the target loads, what this job cannot test (the job's own checks follow in
    :meth:`~specdec.jobs.job.Job.build`): a lookahead other than one integer, a lossy drafter unless allowed, settings
    :func:`verify_distribution` cannot run with; the significance level."""
    check_lookahead(cfg.drafter.k, hint="verify_dist tests one lookahead")
    check_lossy(cfg)
    significance = significance_level(cfg)
    check_settings(length=cfg.data.max_new_tokens, samples_per_prompt=cfg.samples_per_prompt,
                   batch_size=cfg.data.batch_size, joint_tokens=cfg.joint_tokens, significance=significance,
                   temperature=cfg.sampling.temperature, detect_tv=cfg.detect_tv, planted_bug=cfg.planted_bug,
                   min_rows_per_position=cfg.min_rows_per_position, max_samples_per_prompt=cfg.max_samples_per_prompt)
    return significance


def run(cfg: DictConfig) -> VerifyResult:
    significance = check_verify_config(cfg)
    job = Job.build(cfg)
    result = verify_distribution(
        job.target, job.drafter, job.prompts, k=job.k, length=job.max_new_tokens,
        samples_per_prompt=cfg.samples_per_prompt, sampling=job.sampling, batch_size=job.batch_size, seed=job.seed,
        significance=significance, joint_tokens=cfg.joint_tokens, min_rows_per_position=cfg.min_rows_per_position,
        planted_bug=cfg.planted_bug, detect_tv=cfg.detect_tv, max_samples_per_prompt=cfg.max_samples_per_prompt,
        pad_id=job.pad_id, backend=job.backend)
    result.report = {**result.report, **config_fields(cfg), "prompt_ids": list(job.rows["id"]),
                     "device": machine_description(job.device)}
    return result


def summary_text(report: dict[str, Any]) -> str:
    d = report["detectable_tv"]
    lines = [
        f"verdict: {report['verdict'].upper()} (significance level {report['significance']}, Holm over "
        f"{report['num_tests']} tests; "
        f"family p = {report['p_value']:.3g}, smallest raw p = {report['min_raw_p_value']:.3g})",
        f"samples: {report['num_continuations']} continuations × {report['length']} tokens over "
        f"{report['num_prompts']} prompts; acceptance rate α = {report['acceptance_rate']:.3f}, "
        f"τ = {report['mean_accepted_length']:.2f}",
        f"smallest bias it could have detected (TV, power {d['power']}): {d['per_position']:.3f} per position, "
        f"{d['pooled']:.4f} pooled" + (f", {d['two_sample']:.3f} first-token joint" if d["two_sample"] else ""),
        f"PIT TV (95%) pooled: [{report['pooled']['tv_pit']['lower']:.4f}, {report['pooled']['tv_pit']['upper']:.4f}]"
        f"; time {report['timings_s']['total']:.0f} s",
    ]
    if report["verdict"] == "inconclusive":
        lines.append(f"INCONCLUSIVE: no bias could have been detected (the smallest detectable TV, "
                     f"{report['detectable_tv']['pooled']:.2f} pooled, is not below 1, the largest there is); raise "
                     f"samples_per_prompt (now {report['samples_per_prompt']}) or plan it with detect_tv=0.05")
    lines += strata.summary_lines(report)
    if report["impossible_tokens"]:
        lines.append(f"{report['impossible_tokens']} emitted tokens have probability 0 under the target")
    if report["lossy_drafter"]:
        lines.append(f"the drafter verifies with a LOSSY acceptance rule (typical acceptance): REJECT is the "
                     f"expected verdict; PASS means this run had too little power to see its bias (exit status "
                     f"{EXIT_LOSSY_PASSED}, not 0)")
    if report["planted_bug"]:
        caught = "CAUGHT" if report["verdict"] == "reject" else "NOT CAUGHT (too little power for this bias)"
        banner = "!" * 100
        lines = [banner, report["WARNING"], f"planted bug {report['planted_bug']!r}: {caught}", banner, *lines]
    return "\n".join(lines)


def _main(cfg: DictConfig, results_path: Path) -> int:  # the exit code: 0 pass, 3 reject, 4 inconclusive, 5 lossy
    result = run(cfg)
    if result.report["lossy_drafter"] and result.report["exit_code"] == 0:
        result.report["exit_code"] = EXIT_LOSSY_PASSED
    write_json(results_path, result.report)
    if cfg.plot:
        from specdec.report.exactness import plot_result

        save_figure(plot_result(result), results_path.with_suffix(".png"))
    print(summary_text(result.report))
    print(f"results: {results_path}")
    if cfg.logger.name == "wandb":
        from specdec.report import wandb_log_run

        wandb_log_run(cfg, result.report, results_path.parent)
    return result.report["exit_code"]


@hydra.main(config_path=config_dir(), config_name="verify_dist", version_base="1.3")
def main(cfg: DictConfig) -> None:
    code = run_task(cfg, _main, failure_value=0, extra_failure_fields={"planted_bug": cfg.planted_bug})
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
