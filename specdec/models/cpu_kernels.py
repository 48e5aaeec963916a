"""specdec's own CPU kernels (``specdec/csrc/cpu_kernels.cpp``): the linear layers of a decode or
verification step (a few float32 rows; AVX2 + FMA, or AVX-512 where the CPU has it), the step's cache writes
and attention, and RMSNorm, SiLU·up and the rotary embedding fused.

A CPU decode step reads every weight once and is bound by memory bandwidth. oneDNN's and MKL's products
read SmolLM2-135M's 538 MB per token at about two thirds of a plain read's speed on a 2-core x86 CPU; the
few-row product streams each weight once at close to it (the linear layers of one token 39 → 31 ms, of
4 tokens 53 → 40 ms on a 2-core AMD EPYC; see experiments/README.md). The compact forward's products read
weights packed in panels (:func:`pack_panels`, :func:`panel_linear`), which keeps 8-32 rows of a verification
step 1.3-1.5x faster than the row-major :func:`few_rows_linear` (still used by Medusa's heads over the
target's LM head); panels hold float16 where float16 holds the weight exactly (the drafters shipped in
float16), half the bytes for the same bits, and 4- or 8-bit codes with per-block scales where those hold it
exactly (:func:`pack_codes`: a GGUF model dequantised to float32, like the embedded targets; ~112 MB a token
instead of 538 for SmolLM2-135M). Its rows are bit-identical whatever the number of rows, and so
is each query's attention (``csrc/attention.h``: 16 slots' scores per transpose-sum, vectorized exps,
2-3.5x the scalar loop it replaced): a verification step's logits for a position equal a plain decode
step's there, bit for bit.

The kernels are compiled on first use (``torch.utils.cpp_extension``: a C++ compiler and ninja, 40-90 s
on 2 cores, cached under ``~/.cache/torch_extensions`` or ``TORCH_EXTENSIONS_DIR``, one build per torch
version and content of the sources). Where they cannot be (not x86 with AVX2, no compiler, or
``SPECDEC_CPU_KERNEL=0`` in the environment, which skips the build), :func:`available` is false and the forwards
keep torch's ops over oneDNN. Whether a model's forwards use them is its backend's choice
(:class:`specdec.models.backend.Backend`); this module only builds and calls them.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
import os
import platform
import shutil
import sys
import weakref
import warnings
from pathlib import Path

import torch

log = logging.getLogger(__name__)

NAME = "specdec_cpu_kernels"  # the extension's name: the library it builds is NAME + .so (.pyd on Windows)
SOURCE = Path(__file__).resolve().parent.parent / "csrc" / "cpu_kernels.cpp"
# Included by SOURCE; their content, with SOURCE's, names the build directory (see _load).
HEADERS = tuple(SOURCE.parent / name for name in ("rows_product.h", "panel_product.h", "attention.h"))
MAX_ROWS = 32  # up to this many rows the kernel beats oneDNN (measured: 1.28x at 1 row, 1.06x at 32, 0.95x at 48)

_module = None
_state = "untried"  # "untried" | "loaded" | "off" (skipped, unsupported or failed to build)
_CODED_ROWS: dict[int, tuple] = {}  # rows_product's coded panels: id(weight) -> (weakref, version, panels)
_LATER = object()  # seen once: packed at the next use


def supported() -> bool:
    """Whether this machine can run the kernel: x86-64 where torch runs its own AVX2 kernels (AVX2 and FMA)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # older torch
        return False
    return capability.upper().startswith(("AVX2", "AVX512"))


def available() -> bool:
    """Whether the kernels can run here: supported, built (building them on first call), and not skipped
    (``SPECDEC_CPU_KERNEL=0`` in the environment skips the build: torch's ops everywhere)."""
    return _load() is not None


def _staged_source() -> Path:
    """The kernel's sources copied into their build directory (created if needed), where they are compiled.

    One directory per torch installation (its version and location: a build against another torch's headers
    is never loaded) and per content of the sources (a changed header, which torch alone would not notice, gets
    its own build). Compiling the copy, not the checkout's file, keeps the build command the same for every
    checkout with these sources: two clones, or a clone and an installed copy, share one build instead of
    rebuilding over each other (ninja rebuilds whenever the command changes)."""
    from torch.utils import cpp_extension

    contents = {path.name: path.read_bytes() for path in (SOURCE, *HEADERS)}
    key = hashlib.sha256(str(Path(torch.__file__).resolve().parent).encode() + b"".join(contents.values()))
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    build = (Path(root) / f"py{sys.version_info[0]}{sys.version_info[1]}"
             / f"{NAME}-torch{torch.__version__.replace('+', '-')}-{key.hexdigest()[:12]}")
    build.mkdir(parents=True, exist_ok=True)
    for name, content in contents.items():
        staged = build / name
        if not staged.is_file() or staged.read_bytes() != content:  # written whole, never half (a rename)
            partial = build / f"{name}.{os.getpid()}.partial"
            partial.write_bytes(content)
            os.replace(partial, staged)
    return build / SOURCE.name


def _load():
    global _module, _state
    if _state == "untried":
        _state = "off"
        if os.environ.get("SPECDEC_CPU_KERNEL", "1") == "0":
            log.info("SPECDEC_CPU_KERNEL=0: specdec's CPU kernels are not built; using torch's ops")
            return None
        if not supported():
            log.info("specdec's CPU kernel needs x86-64 with AVX2; using oneDNN's products")
            return None
        if not SOURCE.is_file() or not all(header.is_file() for header in HEADERS):
            names = ", ".join(path.name for path in (SOURCE, *HEADERS))
            warnings.warn(f"specdec's CPU kernel sources ({names}) are missing from {SOURCE.parent} in this install; "
                          "CPU decode steps use oneDNN instead", RuntimeWarning, stacklevel=3)
            return None
        _ninja_on_path()
        from torch.utils import cpp_extension

        source = _staged_source()
        if not _built(source.parent):  # a build directory holding the library: torch only loads it
            log.info("building specdec's CPU kernels (%s: once per version of the sources, ~40-90 s, then cached "
                     "in %s)", SOURCE.name, source.parent)
        flags = ["-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp"]
        try:
            _module = cpp_extension.load(NAME, [str(source)], extra_cflags=flags, extra_ldflags=["-fopenmp"],
                                         build_directory=str(source.parent), verbose=False)
        except Exception as error:  # no compiler, no ninja, a failed build: the forward still runs
            warnings.warn(f"specdec's CPU kernel {SOURCE} could not be built ({type(error).__name__}: "
                          f"{str(error).strip()[:300]}); CPU decode steps use oneDNN instead (~1.3x slower). "
                          "Install a C++ compiler and ninja (pip install ninja) to build it, or set "
                          "SPECDEC_CPU_KERNEL=0 to skip it.", RuntimeWarning, stacklevel=3)
            return None
        _state = "loaded"
    return _module


def _built(build: Path) -> bool:
    """Whether ``build`` (a directory of :func:`_staged_source`'s, one per content of the sources) holds the built
    library, which :func:`torch.utils.cpp_extension.load` then loads without compiling."""
    from torch.utils import cpp_extension

    return (build / f"{NAME}{cpp_extension.LIB_EXT}").is_file()


def _ninja_on_path() -> None:
    """torch builds with the ``ninja`` on PATH; the pip package's binary sits in the environment's bin/,
    which is not on PATH when that environment's python runs without being activated."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def module():
    """The built extension (few_rows_linear, panel_linear, product_isa, cache_attention, rms_norm, silu_mul,
    rope_qkv, top_log_softmax); only where :func:`available`."""
    return _module


def rows_product(x: torch.Tensor, weight: torch.Tensor, *, codes: bool = True) -> torch.Tensor | None:
    """x [M, K] · weight [N, K]ᵀ through the kernel where it applies (float32 CPU tensors, no autograd, at most
    ``MAX_ROWS`` rows, the kernel built), else None: for callers outside the compact forward (Medusa's heads,
    over the target's LM-head rows). With ``codes``, a weight that is codes is read from its coded panels (packed
    at its second use and again after an in-place update; the embedded target's LM-head rows: 3.5x fewer bytes),
    others through the row-major product (which costs what float32 panels do at the 1-3 rows of a Medusa call)."""
    if (x.device.type != "cpu" or weight.device.type != "cpu" or x.dtype != torch.float32
            or weight.dtype != torch.float32 or x.dim() != 2 or x.shape[0] > MAX_ROWS
            or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)) or not available()):
        return None
    panels = _coded_rows(weight) if codes else None
    if panels is not None:
        return _module.panel_linear(x.contiguous(), panels, None, weight.shape[0])
    return _module.few_rows_linear(x, weight.contiguous(), None)


def _coded_rows(weight: torch.Tensor) -> torch.Tensor | None:
    """:func:`pack_codes` of ``weight``, kept while the weight lives and is not updated in place; packed at
    its second use (a tensor made for one call, e.g. rows sliced from an LM head anew each time, is not)."""
    key = id(weight)
    version = -1 if weight.is_inference() else weight._version
    entry = _CODED_ROWS.get(key)
    if entry is None or entry[0]() is not weight or entry[1] != version:
        _CODED_ROWS[key] = (weakref.ref(weight, lambda ref: _forget(key, ref)), version, _LATER)
        return None
    if entry[2] is _LATER:
        with torch.no_grad():
            entry = _CODED_ROWS[key] = (entry[0], version, pack_codes(weight.detach().contiguous()))
    return entry[2]


def _forget(key: int, ref: weakref.ref) -> None:
    if key in _CODED_ROWS and _CODED_ROWS[key][0] is ref:
        del _CODED_ROWS[key]


def top_log_softmax(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits.log_softmax(-1).topk(k, dim=-1)`` as (values, indices) [..., k], largest first: through the
    kernel for float32 CPU logits without autograd where the kernels are built (equal values: the smaller
    index first; values equal to torch's to float32 rounding), else torch's ops. A drafter's top-k over its
    vocabulary: torch's topk costs ~40-70 us a row of 8192 on a 2-core Xeon, the kernel a few."""
    if (logits.device.type != "cpu" or logits.dtype != torch.float32 or logits.shape[-1] < k
            or (torch.is_grad_enabled() and logits.requires_grad) or torch.compiler.is_compiling() or not available()):
        top = logits.log_softmax(-1).topk(k, dim=-1)
        return top.values, top.indices
    values, indices = _module.top_log_softmax(logits.reshape(-1, logits.shape[-1]).contiguous(), k)
    return values.view(*logits.shape[:-1], k), indices.view(*logits.shape[:-1], k)


PANEL = 32  # outputs per panel of a packed weight (panel_product.h)


def pack_panels(weight: torch.Tensor, half: bool = False) -> torch.Tensor:
    """weight [N, K] -> [ceil(N/32), K, 32], the layout :func:`panel_linear` reads: panel p holds outputs
    [32p, 32p + 32) as one 32-float row per k (zeros past N). ``half``: the panels in float16, half the bytes
    for the product to stream, for a weight that float16 holds exactly (:func:`exact_in_half`): the kernel
    widens each value exactly, so the product is bit for bit the float32 one."""
    n, k = weight.shape
    padded = torch.nn.functional.pad(weight.detach(), (0, 0, 0, -n % PANEL))
    panels = padded.view(-1, PANEL, k).transpose(1, 2)
    return panels.to(torch.float16).contiguous() if half else panels.contiguous()


def exact_in_half(weight: torch.Tensor) -> bool:
    """Whether float16 holds every value of ``weight`` exactly (a drafter saved in float16 and loaded in
    float32, say; not a dequantised target, whose values need more bits)."""
    with torch.no_grad():
        return bool(torch.equal(weight.detach().to(torch.float16).to(weight.dtype), weight.detach()))


CODE_BLOCK = 32  # weights along k that share a scale (and offset) in coded panels (panel_product.h)
CODE_BITS = (4, 8)  # the codes' widths panel_product.h reads


def pack_codes(weight: torch.Tensor) -> torch.Tensor | None:
    """weight [N, K] as coded panels, the fewest bytes that give every value back exactly, or None where it is
    not such a weight. A GGUF model dequantised to float32 (the embedded SmolLM2 target: Q4_1 layers, a Q8_0
    embedding) holds in each block of 32 weights along k either 4-bit codes, weight = scale · code + offset
    (``uint8`` panels [ceil(N/32), K/32, 768]: scale and offset [32] float32, then 32 rows of 16 bytes, output
    j's code in byte j % 16, low nibble below 16), or 8-bit codes, weight = scale · code (``int8`` panels
    [ceil(N/32), K/32, 1152]: scale [32], then 32 rows of 32 codes), the scale any float32 value, found from the
    values alone (:func:`_fit_codes`: GGUF's Q4_1, Q8_0, Q5_0 and Q4_K, the two embedded targets' types but
    Gemma's Q6_K, whose blocks of 32 hold two scales). Those are 0.75 and 1.125 bytes a weight against float32's
    4, and :func:`panel_linear` widens them to the very float32 values, so its sums are bit for bit those over
    float32 panels. The fit is checked on every weight (with 4 bits, scale · code exact too, so that the kernel's
    one FMA rounds as multiply-then-add); a weight it does not reproduce keeps float panels."""
    n, k = weight.shape
    if k % CODE_BLOCK or weight.dtype != torch.float32 or weight.numel() == 0:
        return None
    with torch.no_grad():
        padded = torch.nn.functional.pad(weight.detach(), (0, 0, 0, -n % PANEL))
        blocks = padded.view(-1, PANEL, k // CODE_BLOCK, CODE_BLOCK)  # [P, output, block, k]
        sample = blocks[:1, :, :4].reshape(-1, CODE_BLOCK)
        for bits in CODE_BITS:  # the fewest bits first; a sample first, the whole weight only where it fits
            if not _may_be_codes(sample[:8], bits):  # a float weight, told in one pass (its fits try ~130 scales)
                continue
            fit = _fit_codes(blocks.reshape(-1, CODE_BLOCK), bits) if _fit_codes(sample, bits) is not None else None
            if fit is not None:
                return _coded_panels(blocks, *fit, bits=bits)
    return None


def round_to_codes(weight: torch.Tensor, bits: int) -> torch.Tensor:
    """``weight`` [N, K] (K a multiple of 32) rounded, block of 32 along k by block, to the nearest values that
    :func:`pack_codes` gives back exactly: 8 bits, ``scale · code`` with codes -127..127 (GGUF's Q8_0); 4 bits,
    ``scale · code + offset`` with codes 0..15 and the block's minimum as offset (Q4_1's, with a float32
    offset); the scale a float16 value. A float32 tensor of the same shape, the weight itself untouched. For a
    drafter's own weights (``drafter.weight_bits``): lossy, so it changes the drafts only, never what
    verification accepts. Each value moves by at most half its block's scale (the span over 15 or 254)."""
    if bits not in CODE_BITS:
        raise ValueError(f"weight codes have 4 or 8 bits, got {bits!r}")
    n, k = weight.shape
    if k % CODE_BLOCK:
        raise ValueError(f"rounding to codes needs the input size to be a multiple of {CODE_BLOCK}, got {k}")
    with torch.no_grad():
        blocks = weight.detach().float().reshape(-1, CODE_BLOCK)
        offset, span, low, high = _code_range(blocks, bits)
        scale = (span / high).to(torch.float16).float()
        if not torch.isfinite(scale).all():
            raise ValueError(f"a block of 32 weights spans {span.max().item():.3g}: beyond float16 scales")
        divisor = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = torch.round((blocks - offset) / divisor).clamp(low, high)
        return (scale * codes + offset).view(n, k)


def _code_range(blocks: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(offset, span, lowest code, highest code) of each row of ``blocks`` [R, 32] for ``bits``-bit codes: 4 bits,
    the row's minimum and max - min over codes 0..15 (Q4_1); 8 bits, 0 and the largest magnitude over -127..127
    (Q8_0)."""
    if bits == 4:
        offset = blocks.amin(-1, keepdim=True)
        return offset, blocks.amax(-1, keepdim=True) - offset, 0, 15
    return torch.zeros_like(blocks[:, :1]), blocks.abs().amax(-1, keepdim=True), -127, 127


def _fit_codes(blocks: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(scale, offset, codes) [R, 1], [R, 1], [R, 32] that give every row of ``blocks`` [R, 32] back exactly through
    the kernel's arithmetic, or None where a row fits none: 4 bits, ``fma(scale, code, offset)`` with codes 0..15;
    8 bits, ``scale * code`` with codes -127..127 (offset 0). Candidates are tried cheapest first, each on the rows
    still unfitted: a float16 scale near the span over the largest code with the block's minimum as offset (GGUF
    Q4_1 and Q8_0: every block of the embedded SmolLM2 and Gemma's Q8_0 embedding), then float32 scales recovered
    from the values themselves (:func:`_float32_fits`: Q4_K's d · sc, Q5_0's d with codes -16..15)."""
    low, high = (0, 15) if bits == 4 else (-127, 127)
    found = (blocks.new_zeros(blocks.shape[0], 1), blocks.new_zeros(blocks.shape[0], 1), torch.zeros_like(blocks))
    todo = torch.arange(blocks.shape[0])
    float16 = _float16_fits(bits)
    for n, guess in enumerate(itertools.chain(float16, _float32_fits(bits))):  # the float32 ones made as tried
        rows = blocks[todo]
        if n == len(float16) and bits == 4 and bool((_distinct(rows) > 16).any()):
            return None  # more values in a block than 4-bit codes have (a row that fit had at most 16)
        scale, offset, codes = guess(rows)
        codes = codes.clamp(low, high)
        fits = _reproduces(rows, scale, offset, codes, bits)
        index = todo[fits]
        found[0][index], found[1][index], found[2][index] = scale[fits], offset[fits], codes[fits]
        todo = todo[~fits]
        if not len(todo):
            return found
    return None


def _may_be_codes(rows: torch.Tensor, bits: int) -> bool:
    """Whether every row of ``rows`` [r, 32] may be ``bits``-bit codes, in one pass: a condition each of
    :func:`_fit_codes`' ~130 (8 bits) or ~1,300 (4 bits) guesses needs, so a float weight is told apart at once.

    8 bits, ``v = s·q`` rounded once with ``|q| <= c <= 127``, ``c`` the code of the largest magnitude ``m``: ``c·v/m``
    lies within 2e-5 of ``q``. 4 bits, ``v = s·q + o`` rounded once with codes 0..15: over the row's span, ``c·(v -
    min)/span`` lies within ``60·ulp(max |v|)/span`` of a whole code for ``c = q_max - q_min <= 15``. A row is not ruled
    out where that bound is loose (a span near the values' rounding, values below 2^-100, not finite) or at most
    two values (4 bits) or none but zeros (8 bits) make it up."""
    values = rows.double()
    if bits == 4:
        if bool((_distinct(rows) > 16).any()):
            return False
        low = values.amin(-1, keepdim=True)
        span = values.amax(-1, keepdim=True) - low
        tol = 60 * (values.abs().amax(-1, keepdim=True) * 2.0 ** -24 + 2.0 ** -149) / span
        judged = (span > 0) & (tol < 0.1)
        ratios, codes = (values - low) / torch.where(judged, span, 1.0), torch.arange(1, 16, dtype=torch.float64)
    else:
        largest = values.abs().amax(-1, keepdim=True)
        judged = torch.isfinite(largest) & (largest >= 2.0 ** -100)
        tol = torch.full_like(largest, 1e-3)
        ratios, codes = values / torch.where(judged, largest, 1.0), torch.arange(1, 128, dtype=torch.float64)
    scaled = ratios[..., None] * codes  # [r, 32, c]
    whole = ((scaled - scaled.round()).abs() <= tol[..., None]).all(1).any(-1)  # [r]: some c gives whole codes
    return bool((whole | ~judged[:, 0]).all())


def _reproduces(rows: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, codes: torch.Tensor,
                bits: int) -> torch.Tensor:
    """Which of ``rows`` [r, 32] the kernel widens back from (scale, offset [r, 1], codes [r, 32]) exactly -> [r]:
    8 bits, one product (``Codes8``); 4 bits, one FMA (``Codes4``), which rounds as torch's multiply then add only
    where ``scale * code`` is exact, so that is checked too (in float64, where the product of a float32 and a
    4-bit code is always exact)."""
    product = scale * codes
    same = (product + offset == rows) if bits == 4 else (product == rows)
    if bits == 4:
        same &= product.double() == scale.double() * codes.double()
    return same.all(-1)


def _float16_fits(bits: int):
    """Guesses (functions of rows [r, 32] -> scale, offset [r, 1], codes [r, 32]) with the scale the float16 value
    nearest the span over the largest code, or one of its neighbours, and the offset the block's minimum (4 bits)
    or 0: a GGUF Q4_1 or Q8_0 block. Such a scale times a code is exact."""
    def guess(rows: torch.Tensor, step: int):
        offset, span, low, high = _code_range(rows, bits)
        if not torch.isfinite(span).all() or span.max() > 15 * 65504.0:
            return _none(rows)
        scale = ((span / high).to(torch.float16).view(torch.int16) + step).view(torch.float16).float()
        divisor = torch.where(scale > 0, scale, torch.ones_like(scale))  # a NaN or negative one fits no row
        return scale, offset, torch.round((rows - offset) / divisor)

    return [functools.partial(guess, step=step) for step in (0, 1, -1, 2, -2)]


def _float32_fits(bits: int):
    """Guesses (as in :func:`_float16_fits`) with float32 scales recovered from the values, for blocks whose scale
    is no float16 value or whose codes do not reach the ends of their range (GGUF Q4_K, Q5_0, ...).

    8 bits: every value is ``scale * code`` exactly, so the scale is the smallest gap between two values (where
    codes next to each other occur) or the largest magnitude over its code, tried 127..1. 4 bits: the values are
    ``scale * code + offset`` rounded once, so the span over its number of steps (estimated from the smallest gap,
    then tried 15..1) is the scale up to rounding; it is snapped to 20 significant bits (so that scale · code is
    exact; Q4_K's d · sc has 17), tried a grid step or two off and with either sign. Codes are counted from the
    block's minimum (its maximum for a negative scale) shifted by 0..15 - steps, and the offset is the float32
    nearest the middle of the range of offsets from which every value rounds back to itself: not the block's
    minimum where code 0 does not occur."""
    if bits == 8:
        return (functools.partial(_symmetric_guess, divisor=divisor) for divisor in (None, *range(127, 0, -1)))
    return (functools.partial(_affine_guess, steps=steps, sign=sign, nudge=nudge, shift=shift)
            for steps in (None, *range(15, 0, -1)) for nudge in (0, 1, -1, 2, -2)
            for shift in range(16 if steps is None else 16 - steps) for sign in (1, -1))


def _symmetric_guess(rows: torch.Tensor, divisor: int | None):
    """scale [r, 1], offset 0, codes [r, 32] for 8-bit codes: the scale is the largest magnitude over ``divisor``,
    or (None) the smallest gap between the block's values."""
    magnitude = rows.abs().amax(-1, keepdim=True)
    scale = _smallest_gap(rows) if divisor is None else magnitude / divisor
    usable = torch.isfinite(scale) & (scale > 0)  # others fit no row but a block of zeros
    return scale, torch.zeros_like(scale), torch.round(rows / torch.where(usable, scale, torch.ones_like(scale)))


def _affine_guess(rows: torch.Tensor, steps: int | None, sign: int, nudge: int, shift: int):
    """scale, offset [r, 1], codes [r, 32] for 4-bit codes (see :func:`_float32_fits`): the span over ``steps``
    codes (None: over the number of smallest gaps it holds), snapped to 20 significant bits, ``nudge`` grid steps
    off, times ``sign``; codes from the block's minimum (maximum for a negative scale) plus ``shift``."""
    low, high = rows.amin(-1, keepdim=True), rows.amax(-1, keepdim=True)
    span = high.double() - low.double()
    if steps is None:
        steps = torch.round(span / _smallest_gap(rows).double()).clamp(1, 15)
    bits = (span / steps).float().view(torch.int32)
    scale = (((bits + 8) >> 4 << 4) + 16 * nudge).view(torch.float32) * sign  # 20 significant bits, if normal
    usable = torch.isfinite(scale) & (scale != 0)
    anchor = low if sign > 0 else high
    codes = torch.round((rows.double() - anchor.double()) / torch.where(usable, scale, 1.0).double()) + shift
    product = scale.double() * codes
    # Every value v rounds back to itself from any sum in [v - half the gap below, v + half the gap above].
    below = (rows.double() + torch.nextafter(rows, rows.new_tensor(-float("inf"))).double()) / 2
    above = (rows.double() + torch.nextafter(rows, rows.new_tensor(float("inf"))).double()) / 2
    offset = (((below - product).amax(-1, keepdim=True) + (above - product).amin(-1, keepdim=True)) / 2).float()
    return scale, offset, codes.float()


def _smallest_gap(rows: torch.Tensor) -> torch.Tensor:
    """The smallest positive difference between two values of each row [r, 32] -> [r, 1] (inf for a constant row)."""
    gaps = rows.sort(-1).values.diff(dim=-1)
    return torch.where(gaps > 0, gaps, float("inf")).amin(-1, keepdim=True)


def _distinct(blocks: torch.Tensor) -> torch.Tensor:
    """How many distinct values each row of ``blocks`` [R, 32] holds -> [R]."""
    return (blocks.sort(-1).values.diff(dim=-1) != 0).sum(-1) + 1


def _none(rows: torch.Tensor):
    """A guess that fits no row."""
    nan = rows.new_full((rows.shape[0], 1), float("nan"))
    return nan, nan, torch.zeros_like(rows)


def _coded_panels(blocks: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, codes: torch.Tensor,
                  bits: int) -> torch.Tensor:
    """The fit of ``blocks`` [P, 32, B, 32] (panel, output, block, k) in the layout of :func:`pack_codes`."""
    panels, _, count, _ = blocks.shape
    scale = scale.view(panels, PANEL, count).transpose(1, 2).contiguous()  # [P, B, 32 outputs]
    codes = codes.view(panels, PANEL, count, CODE_BLOCK).permute(0, 2, 3, 1)  # [P, B, k, 32 outputs]
    parts = [scale.view(torch.uint8)]
    if bits == 4:
        parts.append(offset.view(panels, PANEL, count).transpose(1, 2).contiguous().view(torch.uint8))
        nibbles = codes.to(torch.uint8)
        parts.append((nibbles[..., :PANEL // 2] | (nibbles[..., PANEL // 2:] << 4)).reshape(panels, count, -1))
        return torch.cat(parts, -1).contiguous()
    parts.append(codes.to(torch.int8).reshape(panels, count, -1).view(torch.uint8))
    return torch.cat(parts, -1).view(torch.int8).contiguous()


def panel_linear(x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None, n: int) -> torch.Tensor:
    """x [M, K] · weightᵀ (+ bias [N]) -> [M, N] with the weight from :func:`pack_panels` (float32 or float16
    panels) or :func:`pack_codes`, x float32 on CPU: the product of the decode and verification steps (as fast
    as memory allows at 1 row, 1.3-1.5x the row-major kernel at 8-32 rows on a Skylake Xeon; rows bit-identical
    whatever their number, and whatever the panels' form for the same values). Call only where :func:`available`
    is true."""
    return _module.panel_linear(x, panels, bias, n)


def few_rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] · weight [N, K]ᵀ (+ bias [N]) -> [M, N], float32 on CPU, weight contiguous. Call only where
    :func:`available` is true."""
    return _module.few_rows_linear(x, weight, bias)
