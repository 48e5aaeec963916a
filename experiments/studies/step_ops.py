"""How many torch ops a decode step dispatches outside the graphs it replays: the loop's host work, which a GPU pays
per op (Python, dispatch and, for most, a kernel launch) while what a graph holds replays at once.

    python experiments/studies/step_ops.py             # plain decoding, n-gram K=3 (host, device), 32 new tokens
    python experiments/studies/step_ops.py --new 64
    python experiments/studies/step_ops.py --eagle     # also EAGLE's trees: dynamic, fixed grown on the host or device
    python experiments/studies/step_ops.py --medusa    # also Medusa's trees: dynamic, fixed, fixed with a lookup branch
    python experiments/studies/step_ops.py --medusa --temperature 1   # sampled steps (the exact rule's verdict)
    python experiments/studies/step_ops.py --medusa --temperature 1 --top-p 0.9   # with top-p (nucleus) sampling
    python experiments/studies/step_ops.py --draft-model  # also a draft model's chain: fixed length, confidence floor
    python experiments/studies/step_ops.py --dflash    # also the block drafter's fixed trees, with and without lookup
    python experiments/studies/step_ops.py --read-late # plain decoding and device-only drafters read a step late
    python experiments/studies/step_ops.py --read-late --medusa --after-forward [--step-kernels]
        # also the kernels each verification's graph runs after the target's forward (the verdict, the commit), with
        # --step-kernels through specdec's Triton kernels for them (Backend.step_kernels, under Triton's interpreter)
    python experiments/studies/step_ops.py --read-late --eagle --in-graphs
        # also the kernels a step launches inside each graph it replays (the target's verification, each of the
        # drafter's): torch ops that launch one and Triton's, the target and drafters on specdec's Triton kernels
        # (Backend.interpreted_gpu: a GPU's path under Triton's interpreter; slow)

A tiny random Llama (the tests' ``tiny_llama``: 2 layers, 4 with ``--eagle``, whose random draft layer reads three)
on a decoder with emulated CUDA graphs (the graphed code on CPU), its drafter's work replaying emulated graphs too,
counted with a ``TorchDispatchMode`` that skips whatever runs inside a graph's replay (the target's and the
drafter's alike) or a call of the target outside graphs (its prefill); a graph call's copies of its inputs in and of
its outputs out are counted (a GPU launches them too). Per step: those ops, the graph replays, and the host's reads of
device values (``tolist``, ``item``: each a synchronisation on a GPU). Counts only: no timings, so it may run beside
anything.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests")]  # the tiny models live with the tests


class OutsideGraphs(TorchDispatchMode):
    """Counts the ops dispatched while no graph call is running (``inside`` > 0 within one), the graph calls
    (``replays``) and the host's reads of tensors outside them (``reads``)."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self.inside = self.replays = self.reads = 0
        self.replaying = 0  # graph calls running (one within another replays once)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside:
            self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    def clear(self) -> None:
        self.counts.clear()
        self.replays = self.reads = 0


class InGraphs(TorchDispatchMode):
    """Counts, by graph, the kernels its replays launch: the torch ops that launch one (not views, not allocations)
    and each Triton kernel's launch (the interpreter's own copies of its tensors left out, and the emulation's copies
    of a replay's outputs into the capture's, which a CUDA graph's kernels write in place). A graph is named when
    captured: a drafter's by the key its runtime calls it with, else the target's verification."""

    def __init__(self):
        super().__init__()
        self.counts: collections.defaultdict = collections.defaultdict(collections.Counter)
        self.graph: str | None = None  # the graph replaying
        self.launching = 0  # inside a Triton launch (the interpreter's ops)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if self.graph is not None and not self.launching and not func.is_view and name not in ALLOCATIONS:
            self.counts[self.graph][name] += 1
        return func(*args, **(kwargs or {}))


ALLOCATIONS = ("empty", "new_empty", "empty_like", "empty_strided", "_unsafe_view")  # the last: a view, unmarked


def counting_in_graphs(mode: InGraphs, outside: OutsideGraphs) -> None:
    """Name each emulated graph as it is captured, route its replays' ops and every Triton launch to ``mode`` (a
    launch outside graphs to ``outside``, as one op)."""
    import inspect

    import triton.runtime.interpreter as interpreter

    from specdec.models.graphs import EmulatedGraph

    capture, replay, launch = EmulatedGraph.capture, EmulatedGraph.replay, interpreter.InterpretedFunction.run
    written = EmulatedGraph.written

    def named(self, run):
        stack = inspect.stack()
        keys = [f.frame.f_locals.get("key") for f in stack
                if f.function == "call" and f.filename.endswith("drafters/base.py")]
        drafting = [f.function for f in stack if "/specdec/drafters/" in f.filename]
        self.name = (f"the drafter's {keys[0]!r}" if keys else f"the drafter's {drafting[-1]}" if drafting
                     else "the target's verification")
        return capture(self, run)

    def counted(self):
        outer, mode.graph = mode.graph, mode.graph or getattr(self, "name", "?")
        try:
            return replay(self)
        finally:
            mode.graph = outer

    def launched(self, *a, **kw):
        if not mode.launching:
            if mode.graph is not None:
                mode.counts[mode.graph][self.fn.__name__] += 1
            elif not outside.inside:
                outside.counts[self.fn.__name__] += 1  # one launch outside graphs, not the interpreter's ops
        mode.launching += 1
        outside.inside += 1
        try:
            return launch(self, *a, **kw)
        finally:
            mode.launching -= 1
            outside.inside -= 1

    def uncounted(self, fresh):  # the emulation's copies of a replay's outputs: a CUDA graph writes them in place
        mode.launching += 1
        try:
            return written(self, fresh)
        finally:
            mode.launching -= 1

    EmulatedGraph.capture, EmulatedGraph.replay, interpreter.InterpretedFunction.run = named, counted, launched
    EmulatedGraph.written = uncounted


def counting(mode: OutsideGraphs) -> None:
    """Route every graph call, every call of the target (its prefill, eager, included) and every host read of a
    tensor through ``mode``'s counts."""
    from specdec.models.graphs import EmulatedGraph, GraphedDecoder

    for owner, name, replays in ((EmulatedGraph, "replay", 1), (GraphedDecoder, "__call__", 0)):
        call = getattr(owner, name)

        def counted(self, *a, call=call, replays=replays, **kw):
            mode.inside += 1
            mode.replays += replays and not mode.replaying  # the outermost graph: one replay
            mode.replaying += replays
            try:
                return call(self, *a, **kw)
            finally:
                mode.inside -= 1
                mode.replaying -= replays

        setattr(owner, name, counted)
    for name in ("tolist", "item"):
        read = getattr(torch.Tensor, name)

        def reading(self, *a, read=read, **kw):
            mode.reads += not mode.inside
            return read(self, *a, **kw)

        setattr(torch.Tensor, name, reading)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new", type=int, default=32, help="new tokens per generation")
    parser.add_argument("--eagle", action="store_true", help="also EAGLE's trees (k=16, a random draft layer)")
    parser.add_argument("--medusa", action="store_true", help="also Medusa's trees (3 random heads, 8 paths)")
    parser.add_argument("--dflash", action="store_true",
                        help="also the block drafter's trees (block of 5, 8 paths): fixed, fixed with a lookup branch")
    parser.add_argument("--draft-model", action="store_true",
                        help="also a draft model's chain (K=3, the target's first layer drafting)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sample at this temperature (0: greedy)")
    parser.add_argument("--top-p", type=float, default=1.0, help="sampled: keep this much of p (1: all)")
    parser.add_argument("--read-late", action="store_true",
                        help="the loop a GPU runs for plain decoding and device-only drafters: each step read back "
                             "after the next is launched, its kept counts worked out on the device")
    parser.add_argument("--after-forward", action="store_true",
                        help="also the kernels each verification's graph runs after the target's forward")
    parser.add_argument("--step-kernels", action="store_true",
                        help="the verdict and the commit through specdec's Triton kernels (Backend.step_kernels: a "
                             "GPU's), here under Triton's interpreter")
    parser.add_argument("--in-graphs", action="store_true",
                        help="also the kernels a step launches inside each graph it replays, the target and the "
                             "drafters on specdec's Triton kernels (Backend.interpreted_gpu, under Triton's "
                             "interpreter; slow)")
    args = parser.parse_args()
    if args.in_graphs:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
    if args.step_kernels:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported
        from specdec.models import Backend, gpu_kernels

        Backend.step_kernels = lambda self, device: gpu_kernels
    if args.read_late:
        from specdec.decode import engine

        engine.PIPELINED_DEVICES = ("cpu", "cuda")
    from helpers import ops_after_forward, random_eagle, tiny_llama

    from specdec import autoregressive_generate, speculative_generate
    from specdec.drafters import EagleDrafter, NgramDrafter
    from specdec.models import Backend, as_decoder
    from specdec.models.graphs import GraphedDecoder

    model = tiny_llama(layers=4 if args.eagle else 2, seed=0)
    gpu = Backend.interpreted_gpu() if args.in_graphs else Backend.emulated_gpu()  # the target's and drafters'
    decoder = GraphedDecoder(as_decoder(model, backend=gpu))
    mode = OutsideGraphs()
    counting(mode)
    inside = InGraphs()
    if args.in_graphs:
        counting_in_graphs(inside, mode)
    ids = torch.tensor([[5, 9, 3, 7, 11, 2, 8, 5, 9, 3]])
    lookup = NgramDrafter(on_device=True, device="cpu", backend=gpu)  # a GPU's: in a graph
    lookup.runtime.replay_graphs("auto")
    new = args.new + 1
    generator = torch.Generator().manual_seed(0)
    sampling = dict(temperature=args.temperature, top_p=args.top_p, generator=generator)
    runs = {"plain": lambda: autoregressive_generate(decoder, ids, max_new_tokens=new, eos_token_id=[], **sampling),
            "n-gram K=3": lambda: speculative_generate(decoder, NgramDrafter(), ids, k=3, max_new_tokens=new,
                                                       eos_token_id=[], **sampling),
            "n-gram K=3 on the device": lambda: speculative_generate(decoder, lookup, ids, k=3, max_new_tokens=new,
                                                                     eos_token_id=[], **sampling)}
    if args.eagle:
        def eagle(on_device: bool, **settings):
            drafter = EagleDrafter(random_eagle(model, draft_vocab=40), backend=gpu,
                                   grow_on_device=on_device, **settings)
            drafter.runtime.replay_graphs("auto")
            return lambda: speculative_generate(decoder, drafter, ids, k=16, max_new_tokens=new, eos_token_id=[],
                                                **sampling)

        runs["EAGLE dynamic tree (min_confidence 0.05)"] = eagle(True, min_confidence=0.05)
        runs["EAGLE fixed tree grown on the host (TreeGrowth)"] = eagle(False)
        runs["EAGLE fixed tree grown on the device (DeviceGrowth)"] = eagle(True)
    if args.medusa:
        from helpers import random_heads

        from specdec.drafters import MedusaDrafter

        paths = [[0], [1], [0, 0], [2], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1]]

        def medusa(min_confidence: float, lookup: int):
            drafter = MedusaDrafter(random_heads(), model.lm_head.weight, paths, min_confidence, lookup=lookup,
                                    backend=gpu, lookup_on_device=True)
            drafter.runtime.replay_graphs("auto")
            k = lookup + len(paths)
            return lambda: speculative_generate(decoder, drafter, ids, k=k, max_new_tokens=new, eos_token_id=[],
                                                **sampling)

        runs["Medusa dynamic tree (min_confidence 0.05)"] = medusa(0.05, 0)
        runs["Medusa fixed tree"] = medusa(0.0, 0)
        runs["Medusa fixed tree, a lookup branch of 3 on the device"] = medusa(0.0, 3)
    if args.dflash:
        from helpers import random_dflash

        from specdec.drafters import DFlashDrafter

        paths = [[0], [1], [0, 0], [2], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0]]

        def dflash(lookup: int):
            drafter = DFlashDrafter(random_dflash(model, aux=(0, 1)), paths, lookup=lookup,
                                    backend=gpu)
            drafter.drafting.lookup_on_device = True  # a GPU's, and so drafted on the device alone
            drafter.traits = dataclasses.replace(drafter.traits, device_only=drafter.traits.device_only or lookup > 0)
            drafter.runtime.replay_graphs("auto")
            return lambda: speculative_generate(decoder, drafter, ids, k=lookup + len(paths), max_new_tokens=new,
                                                eos_token_id=[], **sampling)

        runs["block drafter fixed tree"] = dflash(0)
        runs["block drafter fixed tree, a lookup branch of 3 on the device"] = dflash(3)
    if args.draft_model:
        from specdec.drafters import DraftModelDrafter

        def draft_model(confidence: float):
            drafter = DraftModelDrafter(model, num_layers=1, confidence=confidence, backend=gpu)
            drafter.runtime.replay_graphs("auto")
            return lambda: speculative_generate(decoder, drafter, ids, k=3, max_new_tokens=new, eos_token_id=[],
                                                **sampling)

        runs["draft model K=3 (a step's chain: one graph)"] = draft_model(0.0)
        runs["draft model K=3, confidence 0.02 (a graph a forward)"] = draft_model(0.02)
    launches = step_kernel_launches() if args.step_kernels else collections.Counter()
    for name, generate in runs.items():
        before = set(decoder.graphs._graphs)
        generate()  # captures and first calls out of the count
        mode.clear()
        launches.clear()
        inside.counts.clear()
        with torch.no_grad(), mode, inside:
            steps = generate().stats.target_forwards
        print(f"{name}: {sum(mode.counts.values()) / steps:.1f} ops a step outside graphs, {mode.replays / steps:.1f} "
              f"graph replays, {mode.reads / steps:.1f} host reads ({steps} steps): "
              + ", ".join(f"{op} {n / steps:.1f}" for op, n in mode.counts.most_common(10)))
        if args.after_forward:
            for key, entry in decoder.graphs._graphs.items():
                if key not in before:
                    after = ops_after_forward(entry[0].ops, args.step_kernels)
                    print(f"    a verification of {key[1][0][0][1]} tokens, torch ops after the forward: "
                          f"{sum(after.values())} kernels (" + ", ".join(f"{op} {n}" for op, n in after.most_common())
                          + ")")
            if launches:
                print("    the step kernels, a step: " + ", ".join(f"{op} {n / steps:.1f}" for op, n in launches.items()))
        if args.in_graphs:
            total = sum(sum(c.values()) for c in inside.counts.values())
            print(f"    kernels inside the graphs, a step: {total / steps:.1f}")
            for graph, counts in inside.counts.items():
                print(f"      {graph}: {sum(counts.values()) / steps:.1f} ("
                      + ", ".join(f"{op} {n / steps:.1f}" for op, n in counts.most_common(12)) + ")")


def step_kernel_launches() -> collections.Counter:
    """Counts of the step kernels' calls (``gpu_kernels.greedy_verdict``, ``sampled_verdict``, ``move_path``,
    ``commit_step``, and ``sampling_floors`` where it launches: top-k or top-p), by name, as they happen."""
    from specdec.models import gpu_kernels

    counts = collections.Counter()
    for name in ("greedy_verdict", "sampled_verdict", "move_path", "commit_step", "sampling_floors"):
        def counted(*a, real=getattr(gpu_kernels, name), name=name, **kw):
            out = real(*a, **kw)
            counts.update([name] if out is not None or name != "sampling_floors" else [])  # None: nothing launched
            return out

        setattr(gpu_kernels, name, counted)
    return counts


if __name__ == "__main__":
    main()
