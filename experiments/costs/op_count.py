"""How many aten ops a drafter's step and a plain target step dispatch (not a test, not a timing).

On a GPU each op of an eager step is (about) one kernel launch, so the count says how launch-bound a step
is before any GPU is at hand. Counted on the torch path (run with ``SPECDEC_CPU_KERNEL=0``: specdec's CPU
kernels replace whole blocks of ops by one call) over one MT-Bench prompt, greedy; views and shape ops are
counted too (they launch nothing), so the figures are upper bounds on launches.

    SPECDEC_CPU_KERNEL=0 python experiments/costs/op_count.py --new 32
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specdec import autoregressive_generate, load_target, speculative_generate
from specdec.drafters import DraftModelDrafter, EagleDrafter, MedusaDrafter
from specdec.jobs.data import encode_prompt, load_prompts

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments.common
from experiments.common import positive_int  # noqa: E402


class OpCount(TorchDispatchMode):
    """Counts the aten ops dispatched while ``on``."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.on = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.on:
            self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new", type=positive_int, default=32, help="new tokens per generation")
    args = ap.parse_args()
    model, tokenizer = load_target()
    ids = torch.tensor([encode_prompt(tokenizer, load_prompts("mtbench", limit=1)[0])])
    drafters = {
        "eagle (default)": (EagleDrafter.from_config(EagleDrafter.Config(), target=model), EagleDrafter.Config().k),
        "medusa (default)": (MedusaDrafter.from_config(MedusaDrafter.Config(), target=model), MedusaDrafter.Config().k),
        "draft_model K=3": (DraftModelDrafter.from_config(DraftModelDrafter.Config(draft_vocab=8192), target=model), 3),
    }
    for name, (drafter, k) in drafters.items():
        counter, propose = OpCount(), drafter.propose

        def counted(state, k, propose=propose, counter=counter):
            counter.on = True
            try:
                return propose(state, k)
            finally:
                counter.on = False

        drafter.propose = counted
        with counter:
            out = speculative_generate(model, drafter, ids, k=k, max_new_tokens=args.new)
        steps = out.stats.target_forwards
        top = ", ".join(f"{op} {n / steps:.1f}" for op, n in counter.ops.most_common(6))
        print(f"{name}: {sum(counter.ops.values()) / steps:.0f} ops a draft step over {steps} steps ({top})")
    counter = OpCount()
    counter.on = True
    with counter:
        autoregressive_generate(model, ids, max_new_tokens=args.new)
    print(f"plain decoding: {sum(counter.ops.values()) / args.new:.0f} ops a step (the forward and the sampling)")


if __name__ == "__main__":
    main()
