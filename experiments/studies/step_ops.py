"""How many torch ops a decode step dispatches outside the target's forward: the loop's host work, which a GPU pays
per op (Python, dispatch and, for most, a kernel launch) while the forward itself replays as one graph.

    python experiments/studies/step_ops.py             # plain decoding and n-gram K=3, 32 new tokens
    python experiments/studies/step_ops.py --new 64

A tiny random 2-layer Llama (the tests' ``tiny_llama``) on a decoder with emulated CUDA graphs (the graphed code on
CPU), counted with a ``TorchDispatchMode`` that skips whatever runs inside the decoder's call. Counts only: no
timings, so it may run beside anything.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests")]  # the tiny models live with the tests


class OutsideForward(TorchDispatchMode):
    """Counts the ops dispatched while no decoder call is running (``inside`` > 0 within one)."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self.inside = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside:
            self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new", type=int, default=32, help="new tokens per generation")
    args = parser.parse_args()
    from helpers import tiny_llama

    from specdec import autoregressive_generate, speculative_generate
    from specdec.drafters import NgramDrafter
    from specdec.models import Backend, as_decoder
    from specdec.models.graphs import GraphedDecoder

    decoder = GraphedDecoder(as_decoder(tiny_llama(layers=2, seed=0), backend=Backend.emulated_gpu()))
    mode = OutsideForward()
    forward = type(decoder).__call__

    def counted(self, *a, **kw):
        mode.inside += 1
        try:
            return forward(self, *a, **kw)
        finally:
            mode.inside -= 1

    type(decoder).__call__ = counted
    ids = torch.tensor([[5, 9, 3, 7, 11, 2, 8, 5, 9, 3]])
    runs = {"plain": lambda: autoregressive_generate(decoder, ids, max_new_tokens=args.new + 1, eos_token_id=[]),
            "n-gram K=3": lambda: speculative_generate(decoder, NgramDrafter(), ids, k=3, max_new_tokens=args.new + 1,
                                                       eos_token_id=[])}
    for name, generate in runs.items():
        generate()  # captures and first calls out of the count
        mode.counts.clear()
        with torch.no_grad(), mode:
            steps = generate().stats.target_forwards
        print(f"{name}: {sum(mode.counts.values()) / steps:.1f} ops a step outside the forward ({steps} steps): "
              + ", ".join(f"{op} {n / steps:.1f}" for op, n in mode.counts.most_common(12)))


if __name__ == "__main__":
    main()
