"""What one target forward costs by the number of tokens it scores (not a test): the curve behind every
tree-size choice, since a verification step of N nodes is an N-token forward.

On CPU it compares the forward's paths in one process, interleaved, a decoder per backend
(``specdec.models.Backend``) over the one model: torch's ops with MKL's W·xᵀ (``Backend(kernels=False,
onednn=False)``), torch's ops with oneDNN's prepacked products (``Backend(kernels=False)``), and specdec's C++
CPU kernels (the default where they build: the few-row product and the fused small ops,
``specdec.models.cpu_kernels``), over the weights' float32 values (``weights="float"``) and over their 4/8-bit
codes where they are codes (the default, ``target.coded_weights``; the embedded target's are). Prints the median
ms per forward for each token count, and the marginal cost per extra token (the slope from 1 to the largest
count).

    python experiments/costs/forward.py                       # SmolLM2-135M, 1..32 tokens, 200 tokens of context
    python experiments/costs/forward.py --tokens 1 8 16 --context 500
    python experiments/costs/forward.py --kernels-only          # specdec's kernels, float32 values vs codes
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from specdec import load_target
from specdec.jobs.runs import machine_description
from specdec.models import Backend, as_decoder, cpu_kernels

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments.common
from experiments.common import median_ms  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, nargs="*", default=[1, 2, 4, 8, 12, 16, 24, 32])
    ap.add_argument("--context", type=int, default=200, help="tokens already in the cache")
    ap.add_argument("--reps", type=int, default=10, help="timed forwards per point and round")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (the median over rounds is kept)")
    ap.add_argument("--kernels-only", action="store_true", help="leave out torch's ops (MKL, oneDNN)")
    args = ap.parse_args()

    model, _ = load_target(args.target)
    decoder = as_decoder(model)
    paths = {"default": Backend()}
    if decoder.device.type == "cpu":
        paths = {} if args.kernels_only else {"mkl": Backend(kernels=False, onednn=False),
                                              "onednn": Backend(kernels=False)}
        if cpu_kernels.available():
            paths["specdec kernels, float32 weights"] = Backend(weights="float")
            paths["specdec kernels, coded weights (default)"] = Backend()
    decoders = {name: as_decoder(model, backend=backend) for name, backend in paths.items()}
    cache = decoder.new_cache(1, args.context + max(args.tokens) + 8, torch.zeros(1, dtype=torch.long))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        decoder(torch.randint(0, decoder.vocab_size, (1, args.context), generator=generator), cache)
        cache.commit(torch.tensor([args.context]))
        runs: dict[str, list[list[float]]] = {name: [] for name in paths}
        for _ in range(args.rounds):
            for name, path in decoders.items():
                row = []
                for t in args.tokens:
                    ids = torch.randint(0, decoder.vocab_size, (1, t), generator=generator)
                    row.append(median_ms(lambda: path(ids, cache, kv_len=args.context + t), args.reps))
                runs[name].append(row)

    print(f"{args.target}, {args.context} tokens of context, {machine_description()}")
    print("| path | " + " | ".join(f"{t} tok" for t in args.tokens) + " | ms per extra token |")
    print("|---|" + "---|" * (len(args.tokens) + 1))
    for name, rows in runs.items():
        med = [statistics.median(col) for col in zip(*rows)]
        slope = (med[-1] - med[0]) / max(args.tokens[-1] - args.tokens[0], 1)
        print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in med) + f" | {slope:.2f} |")


if __name__ == "__main__":
    main()
