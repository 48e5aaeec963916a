"""wandb logging of a run and of a sweep's summary (imported lazily: a run without the wandb logger never
pays for it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from specdec.report.summary import CATEGORY_METRICS


def _wandb_init(logger: DictConfig, output_dir: Path, **kwargs: Any):
    import wandb

    output_dir.mkdir(parents=True, exist_ok=True)
    return wandb.init(
        project=logger.get("project"), entity=logger.get("entity"), tags=list(logger.get("tags") or []),
        mode=logger.get("mode", "offline"), dir=str(output_dir),
        settings=wandb.Settings(silent=True, console="off"), **kwargs,
    )


def _sweep_group() -> Optional[str]:
    """The sweep's directory as a wandb group, when called inside a Hydra multirun job."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return "_".join(Path(HydraConfig.get().sweep.dir).parts[-2:])


def wandb_log_run(cfg: DictConfig, results: dict, output_dir: str | os.PathLike, group: Optional[str] = None) -> None:
    """Log one run to wandb: the resolved config, scalar metrics, per-position and per-category acceptance.

    ``cfg.logger`` gives project, entity, tags and mode ("offline" needs no network; ``wandb sync`` later).
    The run's files go under ``<output_dir>/wandb``; ``group`` defaults to the sweep in a multirun.
    """
    import wandb

    name = f"{results.get('drafter')}-k{results.get('k')}-T{results.get('temperature')}"
    run = _wandb_init(cfg.logger, Path(output_dir), config=OmegaConf.to_container(cfg, resolve=True), name=name,
                      group=group or _sweep_group(), job_type="run")
    try:
        scalars = {k: v for k, v in results.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        alphas = results.get("acceptance_per_position") or []
        scalars.update({f"acceptance_per_position/{i}": a for i, a in enumerate(alphas, start=1)})
        for category, metrics in (results.get("per_category") or {}).items():
            scalars.update({f"per_category/{category}/{m}": metrics[m] for m in CATEGORY_METRICS if m in metrics})
        if alphas:
            scalars["acceptance_per_position_table"] = wandb.Table(
                columns=["position", "alpha"], data=[[i, a] for i, a in enumerate(alphas, start=1)])
        run.log(scalars)
        run.summary["status"] = results.get("status")
        run.summary["error"] = results.get("error")
    finally:
        run.finish()


def wandb_log_summary(logger: DictConfig, sweep_dir: Path, df: pd.DataFrame, paths: dict[str, Path]) -> None:
    """Log a sweep's summary table and plots as one wandb run (job_type "sweep-summary")."""
    import wandb

    group = "_".join(Path(sweep_dir).parts[-2:])
    run = _wandb_init(logger, Path(sweep_dir), name=f"summary-{group}", group=group, job_type="sweep-summary")
    try:
        table = df.astype(object).where(df.notna(), None)
        logged: dict[str, Any] = {"summary": wandb.Table(dataframe=table)}
        logged.update({name: wandb.Image(str(p)) for name, p in paths.items() if p.suffix == ".png"})
        run.log(logged)
    finally:
        run.finish()
