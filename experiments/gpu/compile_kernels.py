"""specdec's Triton kernels compiled for a GPU on a machine without one: what Triton's interpreter does not check.

The tests run the kernels under Triton's interpreter, which runs what a GPU's compiler refuses (a name rebound to
another type in a loop) and knows no register or shared-memory limit. Here every launch that a few forwards and
kernel calls make under the interpreter is recorded (the kernel, its arguments' types, its compile-time constants,
its launch options), then each distinct one is compiled by Triton's own compiler for the GPU (``--arch``: 90 is an
H100 or H200) to its machine code, whose registers, spills and shared memory ``cuobjdump`` reads. The launches:
one layer of a random target at SmolLM2-135M's, Llama-3.1-8B's and Qwen3-8B's shapes (random weights: only the
kernels' specialisations matter) on specdec's Triton kernels, the norms inside the products or apart, with and without
``exact_numerics`` (a prefill, a one-token step, a chain of 4, a tree of 3), in bf16 (at 135M in float16 and float32
too); then the drafters' kernels alone (the top-k over 8,192 and 49,152 logits, EAGLE's attention over recent slots and
its device tree, the block drafter's inputs and context) and the attention's other divisions (a long cache split into
chunks, 64-row programs). On 2026-11-30 all 155 launches (Medusa's blocks, a catch-up's inputs and the q and k norms
inside the attention among them) compiled for sm_90 with Triton 3.9 (this project's) and 3.6 (the GPU machines'),
none spilling.

    python experiments/gpu/compile_kernels.py                  # sm_90: every launch compiled, the table
    python experiments/gpu/compile_kernels.py --arch 80 90 --json /tmp/compiled.json
    python experiments/gpu/compile_kernels.py --quick          # bf16 at SmolLM2-135M's shape alone (the tests')
    python experiments/gpu/compile_kernels.py --triton /tmp/triton-3.6   # another Triton's compiler (the GPU's)
    python experiments/gpu/compile_kernels.py --planted        # a kernel the interpreter runs and the compiler refuses

Exit status 1 when a launch does not compile or needs more shared memory than the GPU has. Compiled code is cached
by Triton (``~/.triton/cache``): a second run takes seconds. Needs Triton (the ``ptxas`` and ``cuobjdump`` its wheel
carries), no GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}  # bytes of shared memory a block may use
_SMOLLM2 = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
            "head_dim": 64, "rope_scaling": None}
_EIGHT_B = {"intermediate_size": 1024, "num_attention_heads": 4, "num_key_value_heads": 1}  # heads of 128, grouped by 4
# (a synthetic preset, fields replaced, dtypes, the kernels' settings): one layer, a vocabulary of 512. The kernels'
# constants depend on the heads' dimension and grouping and the hidden width (the norm's block), not on the number
# of heads or the MLP's width (both cut at 8B), and those of specdec's product kernel (the norms and SiLU·up inside,
# exact numerics) on nothing of the shape: they run at a narrow width (the interpreter's products at SmolLM2's take
# minutes), the wide shapes with the norms apart and cuBLAS's products (torch's on CPU).
SETTINGS = {"apart": {"fused_products": False}, "fused": {}, "exact": {"exact_numerics": True}}
SHAPES = [
    ("llama-3.1-8b", _SMOLLM2, ("bfloat16", "float16", "float32"), ("apart",)),  # SmolLM2-135M
    ("llama-3.1-8b", {**_SMOLLM2, "hidden_size": 128, "intermediate_size": 64, "num_attention_heads": 2,
                      "num_key_value_heads": 1}, ("bfloat16", "float16", "float32"), ("fused", "exact")),  # narrow
    ("llama-3.1-8b", _EIGHT_B, ("bfloat16",), ("apart",)),
    ("qwen3-8b", _EIGHT_B, ("bfloat16",), ("apart",)),
]
QUICK = [(preset, fields, ("bfloat16",), settings) for preset, fields, _, settings in SHAPES[:2]]  # the tests'



def _planted_kernel():
    """A kernel the interpreter runs and Triton's compiler refuses (``--planted``): a loop-carried name rebound from
    the input's 16-bit type to float32, the kind of bug a GPU run's first minutes found before (2026-11-27)."""
    import triton
    import triton.language as tl

    @triton.jit
    def planted_rebinding_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        for _ in range(2):
            x = x.to(tl.float32) * 2.0
        tl.store(out_ptr + offs, x.to(out_ptr.dtype.element_ty), mask=offs < n)

    return planted_rebinding_kernel


# ---- recording (a child process, TRITON_INTERPRET=1) -----------------------------------------------------------------

_POINTERS = {"float64": "*fp64", "float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16", "int64": "*i64",
             "int32": "*i32", "int8": "*i8", "uint8": "*u8", "bool": "*i1"}


def _argument_type(value) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return _POINTERS[str(value.dtype).removeprefix("torch.")]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"a kernel argument of type {type(value).__name__}: not a tensor, int, float or bool")


def _launch(function, args: tuple, kwargs: dict) -> dict:
    """One launch of an interpreted kernel as the compiler takes it: its arguments' types, its constexprs (given, or
    their defaults), its options. An int argument equal to 1 is a constant, as Triton's launcher specialises it."""
    parameters = inspect.signature(function.fn).parameters
    bound = dict(zip(function.arg_names, args))
    bound.update({name: value for name, value in kwargs.items() if name in parameters})
    signature, constants = {}, {}
    for name, parameter in parameters.items():
        constexpr = "constexpr" in str(parameter.annotation)
        value = bound.get(name, parameter.default)
        if constexpr or value is None or (type(value) is int and value == 1):
            signature[name], constants[name] = "constexpr", value
        else:
            signature[name] = _argument_type(value)
    options = {name: value for name, value in kwargs.items() if name not in parameters}
    return {"kernel": function.fn.__name__, "module": function.fn.__module__, "signature": signature,
            "constants": constants, "options": options}


def _record(launches: list) -> None:
    """Every interpreted kernel launch from here on appended to ``launches``."""
    from triton.runtime.interpreter import InterpretedFunction

    real = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        launches.append(_launch(self, args, kwargs))
        return real(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run


def _forwards(preset: str, fields: dict, dtype, settings: str) -> None:
    """A prefill, a one-token step, a chain of 4 and a tree of 3 through one layer of a random target (``preset``'s
    shape, ``fields`` replaced) on the Triton kernels with ``settings`` (:data:`SETTINGS`), eagerly (a graph replays
    the same launches)."""
    import torch

    from specdec.models import Backend, as_decoder
    from specdec.models.synthetic import synthetic_target

    model = synthetic_target(preset, dtype=dtype, num_hidden_layers=1, vocab_size=512, **fields)
    ids = torch.tensor([[5, 9, 3, 7, 11, 2], [0, 0, 6, 7, 8, 9]])
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    decoder = as_decoder(model, backend=dataclasses.replace(Backend.interpreted_gpu(), **SETTINGS[settings]))
    cache = decoder.new_cache(2, 32, torch.tensor([0, 2]))
    with torch.no_grad():
        decoder(ids, cache, last_only=True)
        cache.commit(torch.tensor([6, 6]))
        decoder(ids[:, :1], cache)
        decoder(ids[:, :4], cache)
        decoder(ids[:, :3], cache, tree_mask=tree, depths=torch.tensor([0, 1, 1]))


def _drafter_kernels(dtype) -> None:
    """What the drafters launch beside the target's layers: the top-k over a draft vocabulary (one kernel, and the
    chunks of a long row then their merge), EAGLE's attention over its recent slots, the block drafter's per-head
    norms, its context's keys rotated and written and its block's inputs, EAGLE's layer input, its device tree's
    levels and choice, the n-gram lookup on the device, a catch-up's inputs, Medusa's residual blocks."""
    import torch

    from specdec.models import gpu_kernels

    g = torch.Generator().manual_seed(0)
    for width in (8192, 49152):
        for log_softmax in (False, True):
            gpu_kernels.top_k(torch.randn(2, width, generator=g).to(dtype), 8, log_softmax=log_softmax)
    heads, kv_heads, dim, new, recent = 9, 3, 64, 3, 2
    keys = torch.randn(2, kv_heads, 32, dim, generator=g).to(dtype)
    lengths, pad = torch.tensor([6, 6]), torch.tensor([0, 2])
    mask = torch.ones(new, recent + new, dtype=torch.bool).tril(recent)
    qkv = torch.randn(2 * new, (heads + 2 * kv_heads) * dim, generator=g).to(dtype)
    cos, sin = (torch.randn(2 * new, dim, generator=g).to(dtype) for _ in range(2))
    gpu_kernels.rotary_attention(qkv, cos, sin, heads, keys, keys.clone(), lengths, pad, mask, recent)
    q, k, v = gpu_kernels.rope_qkv(qkv, cos, sin, heads, kv_heads)
    gpu_kernels.cache_attention(q, k, v, keys, keys.clone(), lengths, pad, mask, recent)
    candidates = 4 + 5 * 16  # EAGLE's default tree: depth 6, top_k 4, expand 4, 16 nodes kept; with a lookup chain
    parent = torch.cat([torch.full((4,), -1), torch.arange(4, candidates).div(4, rounding_mode="floor") - 1])
    for lookup in (0, 3):
        index = torch.zeros(2, candidates, dtype=torch.long)
        gpu_kernels.device_tree(torch.rand(candidates, generator=g), parent, index, torch.arange(32000), 16, 6,
                                4 + (lookup > 0), lookup)
    norm = (torch.ones(dim).to(dtype), 1e-6)  # the block drafter's per-head q and k norms (Qwen3's too)
    gpu_kernels.head_norms(torch.randn(2, (heads + 2 * kv_heads) * dim, generator=g).to(dtype), heads, kv_heads, norm,
                           norm)
    kv = torch.randn(2 * new, 2 * kv_heads * dim, generator=g).to(dtype)  # the block drafter's context written
    for at in (None, torch.arange(2 * new)):
        gpu_kernels.rotary_write(kv, cos, sin, keys, keys.clone(), lengths, at)
        gpu_kernels.rotary_write(kv, cos, sin, keys, keys.clone(), lengths, at, norm)  # its keys normed inside
    gpu_kernels.rotary_attention(qkv, cos, sin, heads, keys, keys.clone(), lengths, pad, norms=(norm, norm))  # block's
    for scale in (1.0, 24.0):  # the block drafter's block inputs (a Gemma target's scaled embeddings)
        gpu_kernels.block_inputs(torch.tensor([1, 5]), torch.randn(2, 576).to(dtype), torch.randn(32, 576).to(dtype),
                                 scale, 16, 0, torch.ones(576).to(dtype), 1e-6)
    gpu_kernels.embedded_norms(torch.tensor([1, 5]), torch.randn(32, 576).to(dtype), 1.0, torch.randn(2, 576).to(dtype),
                               torch.ones(576).to(dtype), 1e-5, torch.ones(576).to(dtype), 1e-5)
    seq = torch.randint(0, 5, (2, 1024))  # the n-gram lookup: the drafter's (k = 4) and a lookup branch's (3)
    for max_tokens in (4, 3):
        gpu_kernels.lookup_continuations(seq, torch.tensor([900, 17]), torch.tensor([0, 3]), max_tokens)
    for tokens in (seq, None):  # a catch-up's inputs: EAGLE's (its tokens), the block drafter's (none)
        gpu_kernels.catch_up_inputs(tokens, torch.tensor([900, 17]), torch.tensor([890, 12]), torch.tensor([0, 3]),
                                    16, 1024)
    for blocks in (4, 3):  # Medusa's residual blocks (4 heads, then the last 3), at SmolLM2-135M's width
        gpu_kernels.residual_silu_product(torch.randn(2, 576, generator=g).to(dtype),
                                          torch.randn(blocks * 576, 576, generator=g).to(dtype),
                                          torch.randn(blocks * 576, generator=g).to(dtype))
    for width in (576, 4096):  # a level's bookkeeping before and after its forward (the first level, a later one)
        logp, index = torch.zeros(2, candidates), torch.zeros(2, candidates, dtype=torch.long)
        outputs, seen = torch.zeros(2, 20, width).to(dtype), torch.zeros(20, 20, dtype=torch.int8)
        lengths, pad, hidden = torch.full((2,), 9), torch.zeros(2, dtype=torch.long), torch.zeros(2, width).to(dtype)
        values, children = torch.zeros(2, 1, 4), torch.zeros(2, 1, 4, dtype=torch.long)
        gpu_kernels.grown_level(values, children, None, None, logp, index, parent, outputs, lengths, 0, 0, 4, 4)
        for level, start, drafted in ((1, 0, 0), (3, 20, 8)):
            size = 4 if level == 1 else 16
            chosen, _, inputs, _, _ = gpu_kernels.grow_level(torch.rand(size, generator=g), index, torch.arange(32000),
                                                             outputs, hidden, seen, lengths, pad, start, drafted,
                                                             level, 4, 4)
            gpu_kernels.grown_level(torch.zeros(2, 4, 4), torch.zeros(2, 4, 4, dtype=torch.long), chosen, inputs,
                                    logp, index, parent, outputs, lengths, start + size, drafted, 4, 4)


def _step_kernels() -> None:
    """What a step launches after the target's forward: the greedy verdict of a chain of 4 and of a tree (three levels,
    three children at most), the sampled verdict of both over SmolLM2's vocabulary (bf16 and float32 logits; a chain
    drafted with its own q, a tree with top-k too, a tree drafted with its own q), the floors of top-k, top-p and both
    (over one block of the vocabulary: the interpreter's bisection over all of it takes long, and the launch is the
    same), a tree's path moved in a bf16 and a float32 cache, the commit with and without EOS tokens."""
    import torch

    from specdec.models import gpu_kernels
    from specdec.verify import Tree

    block, best = torch.zeros(2, 5, dtype=torch.long), torch.ones(2, 5, dtype=torch.long)
    gpu_kernels.greedy_verdict(best, block)
    tree = Tree.from_parents([-1, -1, -1, 0, 3])
    accepted, _, emitted, _, _ = gpu_kernels.greedy_verdict(torch.ones(2, 6, dtype=torch.long),
                                                            torch.zeros(2, 6, dtype=torch.long), tree.children,
                                                            tree.max_depth)
    for dtype in (torch.bfloat16, torch.float32):
        logits = torch.randn(2, 6, 49152).to(dtype)
        gpu_kernels.sampled_verdict(logits[:, :5], block, torch.rand(2, 5, dtype=torch.float64), 0.7)
        gpu_kernels.sampled_verdict(logits[:, :5], block, torch.rand(2, 5, dtype=torch.float64), 0.7,
                                    draft_probs=torch.rand(2, 4, 49152).softmax(-1))
        for top_k in (0, 2):
            gpu_kernels.sampled_verdict(logits, torch.zeros(2, 6, dtype=torch.long),
                                        torch.rand(2, 10, dtype=torch.float64), 1.0, tree.children, tree.max_depth,
                                        top_k=top_k)
        gpu_kernels.sampled_verdict(logits, torch.zeros(2, 6, dtype=torch.long), torch.rand(2, 10, dtype=torch.float64),
                                    1.0, tree.children, tree.max_depth, draft_probs=torch.rand(2, 5, 49152).softmax(-1))
        for top_k, top_p in ((0, 0.9), (2, 0.9)):
            gpu_kernels.sampling_floors(logits[..., :gpu_kernels.VOCAB_BLOCK], 0.7, top_k, top_p)
        gpu_kernels.move_path(torch.zeros(2, 2, 2, 3, 32, 64, dtype=dtype), torch.full((2,), 7),
                              torch.tensor([[0, 3, 5, 1], [0, 1, 1, 1]]))
    for eos in (torch.tensor([2, 7]), torch.zeros(0, dtype=torch.long)):
        gpu_kernels.commit_step(accepted, emitted, torch.ones(2, dtype=torch.bool), torch.full((2,), 9), eos,
                                torch.zeros(2, 64, dtype=torch.long), torch.full((2,), 8), torch.full((2,), 7), 64)


def _attention_tiles(dtype, quick: bool) -> None:
    """The attention's other divisions (:func:`specdec.models.gpu_kernels.attention_tiles`): a one-token step over a
    long cache in chunks, then their merge (SmolLM2-135M's heads; not ``quick``: 8B's too, and a batch of 8 verifying
    64 tokens a row at 8B's heads in programs of 64 query rows, 20 s under the interpreter)."""
    import torch

    from specdec.models import gpu_kernels

    g = torch.Generator().manual_seed(0)
    shapes = [(1, 1, 9, 3, 64, 4096)] + ([] if quick else [(1, 1, 32, 8, 128, 4096), (8, 64, 32, 8, 128, 96)])
    for b, new, heads, kv_heads, dim, capacity in shapes:
        keys = torch.randn(b, kv_heads, capacity, dim, generator=g).to(dtype)
        qkv = torch.randn(b * new, (heads + 2 * kv_heads) * dim, generator=g).to(dtype)
        cos, sin = (torch.randn(b * new, dim, generator=g).to(dtype) for _ in range(2))
        lengths, pad = torch.full((b,), 30 if new > 1 else 1500), torch.zeros(b, dtype=torch.long)
        gpu_kernels.rotary_attention(qkv, cos, sin, heads, keys, keys.clone(), lengths, pad)


def record_launches(planted: bool = False, quick: bool = False) -> list[dict]:
    """The distinct launches of the forwards and drafter kernels above (this process runs Triton's interpreter);
    ``quick``: bf16 at SmolLM2-135M's shape alone."""
    import torch

    launches: list[dict] = []
    _record(launches)
    if planted:
        x = torch.randn(16, dtype=torch.bfloat16)
        _planted_kernel()[(1,)](x, torch.empty_like(x), 16, BLOCK=16)  # the interpreter runs it
    else:
        for preset, fields, dtypes, settings in QUICK if quick else SHAPES:
            for name in dtypes:
                for setting in settings:
                    _forwards(preset, fields, getattr(torch, name), setting)
        for name in ("bfloat16",) if quick else ("bfloat16", "float32"):
            _drafter_kernels(getattr(torch, name))
            _attention_tiles(getattr(torch, name), quick)
        _step_kernels()
    distinct = {json.dumps(launch, sort_keys=True): launch for launch in launches}
    return list(distinct.values())


# ---- compiling (this process, no interpreter) ------------------------------------------------------------------------

def _kernel(launch: dict):
    if launch["kernel"] == "planted_rebinding_kernel":
        return _planted_kernel()
    module = __import__(launch["module"], fromlist=["_"])
    return getattr(module, launch["kernel"])


def _resources(cubin: bytes, tool: Path) -> dict:
    """Registers, stack and local (spilled) bytes of a compiled kernel, as ``cuobjdump -res-usage`` reads them."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        text = subprocess.run([str(tool), "-res-usage", file.name], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", text)
    return {} if found is None else {"registers": int(found[1]), "stack": int(found[2]), "local": int(found[4])}


def compile_launch(launch: dict, arch: int) -> dict:
    """``launch`` compiled for ``arch`` (e.g. 90): its shared memory, registers and spills, or the compiler's error."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(_kernel(launch), launch["signature"], launch["constants"])
    start = time.perf_counter()
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=launch["options"])
    except Exception as exc:  # the compiler's refusal is what this reports
        return {"error": f"{type(exc).__name__}: {str(exc).strip()[:2000]}"}
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    result = {"shared": compiled.metadata.shared, "warps": compiled.metadata.num_warps,
              "seconds": round(time.perf_counter() - start, 2)}
    if tool.exists():
        result.update(_resources(compiled.asm["cubin"], tool))
    if result["shared"] > SHARED_LIMIT.get(arch, min(SHARED_LIMIT.values())):
        result["error"] = (f"needs {result['shared']} bytes of shared memory a block, over sm_{arch}'s "
                           f"{SHARED_LIMIT.get(arch, min(SHARED_LIMIT.values()))}")
    return result


def _describe(launch: dict) -> str:
    """A launch's pointer types and its constants that are not sizes, in a line."""
    types = sorted({t[1:] for t in launch["signature"].values() if t in ("*fp32", "*fp16", "*bf16")})
    flags = [f"{k}={v}" for k, v in launch["constants"].items() if isinstance(v, bool) and v or
             (k.startswith("BLOCK") or k in ("GROUP", "CHUNK", "PLANT", "PROLOGUE")) and v]
    return "/".join(types) + (" " + " ".join(flags) if flags else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, nargs="+", default=[90], help="compute capabilities (90: H100, H200; 80: A100)")
    ap.add_argument("--json", help="write every launch and its result here")
    ap.add_argument("--quick", action="store_true", help="bf16 at SmolLM2-135M's shape alone (the default tests)")
    ap.add_argument("--planted", action="store_true", help="compile a planted kernel the compiler refuses instead")
    ap.add_argument("--triton", help="compile with the Triton in this directory instead (`pip install --target DIR "
                    "triton==3.6.0`: the GPU machines' version); the launches are recorded with this environment's")
    ap.add_argument("--record", help=argparse.SUPPRESS)  # the child: record under the interpreter, write here
    args = ap.parse_args()
    if args.record:
        Path(args.record).write_text(json.dumps(record_launches(args.planted, args.quick)))
        return
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("compile_kernels.py compiles for a GPU: run it without TRITON_INTERPRET (it sets it for the "
                         "process that records the launches)")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        recorded = Path(scratch) / "launches.json"
        child = [sys.executable, __file__, "--record", str(recorded)] + (["--planted"] if args.planted else []) + (
            ["--quick"] if args.quick else [])
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(
            [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        subprocess.run(child, check=True, env=env)
        launches = json.loads(recorded.read_text())
    recording = time.perf_counter() - start
    if args.triton:
        sys.path.insert(0, str(Path(args.triton).resolve()))
    import triton

    results, failed = [], 0
    print(f"Triton {triton.__version__}: {len(launches)} distinct launches recorded in {recording:.0f} s; compiled for "
          f"sm_{', sm_'.join(map(str, args.arch))}")
    print(f"| kernel | arch | types and flags | warps | registers | spilled bytes | shared bytes | s |")
    print("|---|---|---|---|---|---|---|---|")
    for launch in sorted(launches, key=lambda item: item["kernel"]):
        for arch in args.arch:
            result = compile_launch(launch, arch)
            results.append({**launch, "arch": arch, **result})
            if "error" in result:
                failed += 1
                print(f"| {launch['kernel']} | {arch} | {_describe(launch)} | FAILED: {result['error'][:300]} |")
                continue
            print(f"| {launch['kernel']} | {arch} | {_describe(launch)} | {result['warps']} | "
                  f"{result.get('registers', '?')} | {result.get('local', '?')} | {result['shared']} | "
                  f"{result['seconds']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"{len(results) - failed} of {len(results)} compiled in {time.perf_counter() - start:.0f} s"
          + (f"; {failed} FAILED" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
