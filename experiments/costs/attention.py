"""What a step's attention costs on CPU (not a test): specdec's ``cache_attention`` (the cache writes and each
query's attention in one C++ pass) and torch's path without the kernels (``KVCache.write``, the step's mask,
SDPA), side by side in one process, by the number of queries and the context length, at SmolLM2-135M's head
shapes (9 query heads, 3 key/value heads, 64 wide) and 30 layers.

``--build PATH`` times the ``cache_attention`` of another build of the kernels instead of the package's (the
``specdec_cpu_kernels.so`` of an older commit, e.g.): run it once per build, one after the other on a quiet
machine, and compare each run's ratio to SDPA rather than absolute times.

    python experiments/costs/attention.py                      # 1..32 queries, 200 and 600 tokens of context
    python experiments/costs/attention.py --queries 1 16 --context 1000
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.jobs.runs import machine_description
from specdec.models import cpu_kernels
from specdec.models.cache import KVCache

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: experiments.common
from experiments.common import median_ms  # noqa: E402

HEADS, KV_HEADS, DIM, LAYERS, CAPACITY = 9, 3, 64, 30, 2048


def kernels_from(path: str | None):
    """The package's built kernels, or the module of another build's .so."""
    if path is None:
        if not cpu_kernels.available():
            raise SystemExit("specdec's CPU kernels are not built here (not x86 with AVX2, no compiler, or "
                             "SPECDEC_CPU_KERNEL=0): nothing to time")
        return cpu_kernels.module()
    spec = importlib.util.spec_from_file_location("specdec_cpu_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if Path(module.__file__).resolve() != Path(path).resolve():  # Python keeps one extension module per name
        raise SystemExit(f"another build of specdec_cpu_kernels ({module.__file__}) is already loaded in this "
                         f"process: time {path} in a process of its own")
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queries", type=int, nargs="+", default=[1, 4, 16, 32], help="tokens per step")
    ap.add_argument("--context", type=int, nargs="+", default=[200, 600], help="committed tokens before the step")
    ap.add_argument("--reps", type=int, default=9, help="timed repetitions of 30 layers (median)")
    ap.add_argument("--build", default=None, help="another build's specdec_cpu_kernels.so to time instead")
    args = ap.parse_args()
    kernels = kernels_from(args.build)
    torch.manual_seed(0)
    print(f"{machine_description()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"kernels: {args.build or 'the package build'}; ms per {LAYERS} layers")
    print("| context | queries | specdec cache_attention | torch: write + mask + SDPA | specdec / torch |")
    print("|---|---|---|---|---|")
    for context in args.context:
        for t in args.queries:
            cache = KVCache.allocate(1, 1, KV_HEADS, CAPACITY, DIM, torch.tensor([0]), dtype=torch.float32,
                                     device=torch.device("cpu"))
            cache.keys[0].normal_()
            cache.values[0].normal_()
            cache.commit(torch.tensor([context]))
            q, k, v = torch.randn(t, HEADS, DIM), torch.randn(t, KV_HEADS, DIM), torch.randn(t, KV_HEADS, DIM)

            def ours():
                for _ in range(LAYERS):  # the step is not committed, so every layer writes the same slots
                    kernels.cache_attention(q, k, v, cache.keys[0], cache.values[0], cache.lengths, cache.pad, None)

            def theirs():
                for _ in range(LAYERS):
                    keys, values = cache.write(0, k.view(1, t, KV_HEADS, DIM).transpose(1, 2),
                                               v.view(1, t, KV_HEADS, DIM).transpose(1, 2), context + t)
                    mask = cache.attention_mask(t, context + t, None)
                    F.scaled_dot_product_attention(q.view(1, t, HEADS, DIM).transpose(1, 2), keys, values,
                                                   attn_mask=mask, enable_gqa=True)

            a, b = median_ms(ours, args.reps), median_ms(theirs, args.reps)
            print(f"| {context} | {t} | {a:.2f} | {b:.2f} | {a / b:.2f} |")


if __name__ == "__main__":
    main()
