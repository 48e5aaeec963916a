"""What the CPU kernel's products cost by the number of rows (not a test): the row-major product
(``few_rows_linear``) against the product over weights packed in panels (``panel_linear``, what the compact
forward uses), for each instruction set the CPU has, interleaved in one process.

The weights are 8 layers of SmolLM2-135M's shapes (q|k|v 960x576, o 576x576, gate|up 3072x576, down
576x1536; 113 MB, more than the caches hold), random. Prints the median ms over the 8 layers per row count.

    python experiments/costs/product.py                          # 1..32 rows, avx512 and avx2 where present
    python experiments/costs/product.py --rows 1 16 --isa avx2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec.jobs.runs import machine_description
from specdec.models import cpu_kernels

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # [N, K] of one SmolLM2-135M layer's products


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 24, 32])
    ap.add_argument("--isa", nargs="+", default=["avx512", "avx2"], help="instruction sets to try (skipped where absent)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not cpu_kernels.available():
        raise SystemExit("specdec's CPU kernels are not available on this machine (see specdec/models/cpu_kernels.py)")
    kernels = cpu_kernels.module()
    isas = []
    for isa in args.isa:
        try:
            kernels.product_isa(isa)
            isas.append(isa)
        except RuntimeError:
            print(f"skipping {isa}: this CPU does not have it")
    torch.manual_seed(0)
    weights = [[torch.randn(n, k) for n, k in SHAPES] for _ in range(8)]
    panels = [[cpu_kernels.pack_panels(w) for w in layer] for layer in weights]

    def run(kind: str, xs: dict) -> None:
        for layer, packed in zip(weights, panels):
            for w, p in zip(layer, packed):
                x = xs[w.shape[1]]
                if kind == "rows":
                    kernels.few_rows_linear(x, w, None)
                else:
                    kernels.panel_linear(x, p, None, w.shape[0])

    print(machine_description())
    variants = [(isa, kind) for isa in isas for kind in ("rows", "panels")]
    print("| rows | " + " | ".join(f"{isa} {kind} ms" for isa, kind in variants) + " | "
          + " | ".join(f"{isa} panels / rows" for isa in isas) + " |")
    print("|---" * (1 + len(variants) + len(isas)) + "|")
    for m in args.rows:
        xs = {k: torch.randn(m, k) for k in (576, 1536)}
        times = {v: [] for v in variants}
        for _ in range(args.rounds + 1):  # the first round warms up
            for isa, kind in variants:
                kernels.product_isa(isa)
                start = time.perf_counter()
                run(kind, xs)
                times[(isa, kind)].append(time.perf_counter() - start)
        ms = {v: statistics.median(t[1:]) * 1e3 for v, t in times.items()}
        print(f"| {m} | " + " | ".join(f"{ms[v]:.2f}" for v in variants) + " | "
              + " | ".join(f"{ms[(isa, 'panels')] / ms[(isa, 'rows')]:.2f}" for isa in isas) + " |")


if __name__ == "__main__":
    main()
