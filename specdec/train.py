"""Train a learned drafter for a frozen target, reproducibly, on one CPU or many GPUs.

    python -m specdec.train                                          # Medusa-1 heads (~36 min on a 2-core CPU)
    python -m specdec.train method=medusa method.token_aware=true    # token-aware heads, as shipped
    python -m specdec.train data.mode=text                           # on a text corpus instead of the target's answers
    python -m specdec.train target.name=/path/to/model run_name=mine export=heads/mine
    accelerate launch -m specdec.train ...                           # several GPUs, no code change

Rerunning the same command resumes from the latest checkpoint in ``outputs/train/<method>/<run_name>``. A
finished run prints the command that decodes with what it wrote, e.g.
``python -m specdec.run drafter=medusa drafter.path=heads/mine``.
Every field: :mod:`specdec.training.config` and the method's config (e.g.
:class:`specdec.training.methods.medusa.MedusaMethodConfig`); what happens: :mod:`specdec.training`.
"""

from __future__ import annotations

import json
import math

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from specdec.config import config_dir
from specdec.jobs.checks import check_target_choice
from specdec.jobs.runs import refuse_briefly
from specdec.training.config import register_train_configs
from specdec.training.trainer import train

register_train_configs()


@hydra.main(config_path=config_dir(), config_name="train", version_base="1.3")
def main(dict_cfg: DictConfig) -> float:
    try:
        check_target_choice(dict_cfg)
        cfg = OmegaConf.to_object(dict_cfg)
        metrics = train(cfg)
    except Exception as exc:  # a refused setting: its message alone, outside a multirun
        if HydraConfig.get().mode != RunMode.MULTIRUN:
            refuse_briefly(exc)
        raise
    print(json.dumps(metrics, indent=1))
    if not metrics["finished"]:
        print(f"stopped at step {metrics['step']} of {metrics['total_steps']}: rerun the same command to resume")
    elif "decode_command" in metrics:  # the main process: it evaluated and wrote the drafter
        print(f"decode with what this run wrote:\n  {metrics['decode_command']}")
    return metrics.get("score", math.nan)  # what a sweep maximises


if __name__ == "__main__":
    main()
