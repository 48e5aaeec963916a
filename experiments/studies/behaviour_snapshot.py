"""Did a change alter what specdec decodes? The main job's greedy outputs and τ per drafter, written once before a
change and compared after it (a refactor must leave both identical, token for token).

    python experiments/studies/behaviour_snapshot.py --out before.json               # every shipped drafter
    python experiments/studies/behaviour_snapshot.py --out after.json --compare before.json
    python experiments/studies/behaviour_snapshot.py --drafters eagle ngram --out quick.json

Each drafter runs the main job's own ``run()`` (its default prompts: 8 MT-Bench + 8 HumanEval, greedy, the real
target; the drafter preset's fixed k, not the main job's machine-dependent ``drafter.k=auto``) with every
speculative and plain generation's sequences recorded on the way. The speedups it also prints are not figures to report (no warm-up; another program may be running): only the outputs and τ count here.
With ``--compare`` it exits 1 when any output, τ or α differs from the earlier snapshot.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from unittest import mock

DRAFTERS = ["eagle", "medusa", "draft_model", "ngram", "dflash"]


def snapshot(drafter: str) -> dict:
    """The main job on ``drafter``: τ, α, the greedy mismatch count and every generation's sequences."""
    from hydra import compose, initialize_config_dir

    import specdec.run as job
    from specdec.config import config_dir

    recorded: dict[str, list] = {"speculative": [], "plain": []}

    def recording(kind, generate):
        def wrapper(*args, **kwargs):
            out = generate(*args, **kwargs)
            recorded[kind].append(out.sequences)
            return out
        return wrapper

    from omegaconf import OmegaConf

    # the preset's k (a registered drafter's or a preset's, such as cross_vocab), not the main job's k=auto, whose
    # choice depends on the machine
    preset = OmegaConf.load(Path(config_dir()) / "drafter" / f"{drafter}.yaml").k
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("run", overrides=[f"drafter={drafter}", f"drafter.k={preset}", "warmup=false"])
    with mock.patch.object(job, "speculative_generate", recording("speculative", job.speculative_generate)), \
            mock.patch.object(job, "autoregressive_generate", recording("plain", job.autoregressive_generate)):
        results = job.run(cfg)
    return {"tau": results["mean_accepted_length"], "alpha": results["acceptance_rate"],
            "greedy_mismatches": results["greedy_mismatches"], "speedup_not_a_figure": results["speedup"], **recorded}


def differences(before: dict, after: dict) -> list[str]:
    """What differs between two snapshots, drafter by drafter (outputs, τ, α)."""
    found = []
    for drafter in sorted(set(before) & set(after)):
        for key in ("speculative", "plain", "tau", "alpha"):
            if before[drafter][key] != after[drafter][key]:
                found.append(f"{drafter}: {key} differs")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drafters", nargs="+", default=DRAFTERS, choices=DRAFTERS)
    parser.add_argument("--out", type=Path, required=True, help="where to write this snapshot (JSON)")
    parser.add_argument("--compare", type=Path, help="an earlier snapshot: exit 1 if anything differs from it")
    args = parser.parse_args(argv)
    taken = {}
    for drafter in args.drafters:
        taken[drafter] = snapshot(drafter)
        r = taken[drafter]
        print(f"{drafter}: τ {r['tau']:.4f}, α {r['alpha']:.4f}, greedy mismatches {r['greedy_mismatches']}", flush=True)
    args.out.write_text(json.dumps(taken))
    if args.compare is None:
        return 0
    found = differences(json.loads(args.compare.read_text()), taken)
    print("\n".join(found) if found else f"identical to {args.compare}: outputs, τ and α of {', '.join(taken)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
