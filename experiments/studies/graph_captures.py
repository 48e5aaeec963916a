"""Does a drafter capture graphs again for each new prompt? The captures of each drafter's graphs after each of ten
prompts of different lengths (3 to 12 tokens, greedy, 16 new tokens each, batch 1): a count that keeps growing is a
graph keyed by something the prompt sets, captured (warm-ups and all) and kept again every generation.

    python experiments/studies/graph_captures.py

A tiny random Llama (the tests' ``tiny_llama``, 4 layers) on a decoder with emulated CUDA graphs (the graphed code
on CPU), each drafter's work replaying emulated graphs too: the n-gram lookup on the device, EAGLE (dynamic tree,
device tree with a lookup branch, chain), the block drafter (chain, tree), Medusa (tree with a lookup branch), a
draft model. Counts only: no timings, so it may run beside anything.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests")]  # the tiny models live with the tests

LENGTHS = range(3, 13)


def drafters(model, backend) -> dict:
    """The drafters counted, by name: each made fresh (a function), its work on ``backend``."""
    from helpers import PATHS, random_dflash, random_eagle, random_heads, tiny_llama

    from specdec import DraftModelDrafter, NgramDrafter
    from specdec.drafters.dflash import DFlashDrafter
    from specdec.drafters.eagle import EagleDrafter
    from specdec.drafters.medusa import MedusaDrafter

    lm_head = model.lm_head.weight
    return {
        "n-gram lookup on the device": lambda: NgramDrafter(on_device=True, device="cpu", backend=backend),
        "EAGLE dynamic tree": lambda: EagleDrafter(random_eagle(model), min_confidence=0.05, backend=backend),
        "EAGLE device tree, lookup branch": lambda: EagleDrafter(random_eagle(model), lookup=3, lookup_on_device=True,
                                                                 grow_on_device=True, backend=backend),
        "EAGLE chain": lambda: EagleDrafter(random_eagle(model), tree=False, backend=backend),
        "block drafter chain": lambda: DFlashDrafter(random_dflash(model, draft_vocab=40), None, backend=backend),
        "block drafter tree": lambda: DFlashDrafter(random_dflash(model, draft_vocab=40), PATHS, backend=backend),
        "Medusa tree, lookup branch": lambda: MedusaDrafter(random_heads(), lm_head, paths=PATHS, lookup=3,
                                                            lookup_on_device=True, backend=backend),
        "draft model chain": lambda: DraftModelDrafter(tiny_llama(hidden=16, layers=1, heads=2, kv_heads=1, seed=1),
                                                       backend=backend),
    }


def main() -> None:
    from helpers import tiny_llama

    from specdec import speculative_generate
    from specdec.models import Backend, GraphedDecoder, as_decoder

    model = tiny_llama(layers=4, seed=0)
    backend = Backend.emulated_gpu()
    target = GraphedDecoder(as_decoder(model, backend=backend))
    print(f"graph captures after each of {len(LENGTHS)} prompts of {LENGTHS.start}-{LENGTHS.stop - 1} tokens")
    for name, make in drafters(model, backend).items():
        drafter = make()
        drafter.runtime.replay_graphs("auto")
        counts = []
        for n in LENGTHS:
            ids = torch.tensor([[(5 + 3 * i) % 60 + 1 for i in range(n)]])
            speculative_generate(target, drafter, ids, k=8 if "tree" in name else 4, max_new_tokens=16,
                                 eos_token_id=[])
            counts.append(sum(runner.captures for runner in drafter.runtime.runners()))
        print(f"{name:34s} {counts}")


if __name__ == "__main__":
    main()
