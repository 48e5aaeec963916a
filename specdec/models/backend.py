"""How a model's forwards run: one :class:`Backend`, chosen when the model is loaded and held by what runs it (the
target's :class:`~specdec.models.compact.CompactDecoder`, a drafter's models), which its forwards consult
(``backend.linear(x, layer)``, ``backend.fused_kernels(x)``). Nothing here is process-wide except memos of derived
data (packed copies of weights, rebuilt when a weight changes).

The fused forwards (the target's Llama-family layers, EAGLE's layer, the block drafter's) run one kernel set of the
same calls on either device (:meth:`Backend.fused_kernels`): specdec's CPU kernels for float32 on CPU, its Triton
kernels on a CUDA device (:mod:`specdec.models.gpu_kernels`; their products over q|k|v and gate|up stacked once,
:class:`Stacked`), or none (torch's ops, the reference every test compares against).

A backend names the kernels (specdec's fused CPU kernels, :mod:`specdec.models.cpu_kernels`, or torch's ops; for
the products the kernels leave, oneDNN's or MKL's), the panels (float16 where float16 holds a weight exactly, or
float32) and the weight format: ``"codes"`` streams a weight that is 4- or 8-bit codes with per-block scales (a
GGUF model dequantised to float32, like the embedded SmolLM2 target) as those codes, the products bit for bit the
float32 ones; ``"float"`` streams its float32 values. On an accelerator every product is ``F.linear`` whatever the
backend; ``gpu_kernels=False`` keeps torch's ops there. :meth:`Backend.emulated_gpu` runs the torch ops a GPU runs
and replays graphs on CPU (:class:`~specdec.models.graphs.EmulatedGraph`), for tests of the graphed code on machines
without a GPU; :meth:`Backend.interpreted_gpu` runs the Triton kernels there too, under Triton's interpreter.

    decoder = as_decoder(model, backend=Backend(weights="float"))   # python -m specdec.run target.coded_weights=false
"""

from __future__ import annotations

import functools
import operator
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from specdec.models import cpu_kernels

WEIGHT_FORMATS = ("codes", "float")

# nn.Linear -> {(packed or not, panel forms, ids of the layers stacked together, this one first) -> (weak references
# to their weights, the layers and their biases, the weights' and biases' versions then, the stacked copy
# (oneDNN-packed, or packed in panels for specdec's kernel), the stacked bias)}: a memo of derived data; identities
# (live references, not addresses that a freed tensor's successor may take) and versions say whether the copy is
# current. Decoders over the same model share it; each backend's forms get their own copy.
_PACKED: "weakref.WeakKeyDictionary[nn.Linear, dict]" = weakref.WeakKeyDictionary()
_ONEDNN_DTYPES = (torch.float32,)
_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class Stacked(NamedTuple):
    """Linear layers reading one input, their weights (and biases) stacked along the output once: one product for
    q|k|v or gate|up on a GPU (:meth:`ProductPlan.group` with ``stacked``), as ``F.linear``."""

    weight: torch.Tensor  # [sum of out, in]
    bias: torch.Tensor | None  # [sum of out]


@dataclass(frozen=True)
class Backend:
    """How a model's CPU forwards run (see the module docstring); the defaults are the fastest exact ones."""

    kernels: bool = True  # specdec's fused CPU kernels where they are built (cpu_kernels.available()); False: torch's
    onednn: bool = True  # oneDNN's products where the kernels do not run (a prefill; all of them without kernels)
    half_panels: bool = True  # the kernels' panels in float16 where float16 holds a weight exactly (the drafters)
    weights: str = "codes"  # "codes": weights that are codes streamed as such; "float": as their float32 values
    emulate_graphs: bool = False  # CPU forwards take the graphed paths (emulated graphs: tests; see emulated_gpu)
    gpu_kernels: bool = True  # specdec's Triton kernels in the fused forwards on a GPU (gpu_kernels.available())
    triton_on_cpu: bool = False  # those kernels on CPU tensors, under Triton's interpreter (tests; interpreted_gpu)
    fused_products: bool = True  # with those kernels: a step's RMSNorms and SiLU·up inside the products reading them
    exact_numerics: bool = False  # with those kernels: a row's arithmetic in one order whatever the forward carries
    fused_steps: bool = True  # with those kernels: a step's verdict, path move and commit in one kernel each

    def __post_init__(self):
        if self.weights not in WEIGHT_FORMATS:
            raise ValueError(f"Backend(weights={self.weights!r}): use 'codes' (weights that are 4- or 8-bit codes "
                             f"streamed as such, the same products) or 'float' (their float32 values)")
        if self.emulate_graphs and (self.kernels or self.onednn):
            raise ValueError("Backend(emulate_graphs=True) runs the torch ops a GPU runs: use Backend.emulated_gpu() "
                             "(kernels=False, onednn=False)")
        if self.triton_on_cpu and not (self.emulate_graphs and self.gpu_kernels):
            raise ValueError("Backend(triton_on_cpu=True) runs a GPU's forwards on CPU: use Backend.interpreted_gpu()")
        if self.exact_numerics and not self.gpu_kernels:
            raise ValueError("exact_numerics (target.exact_numerics) orders the arithmetic of specdec's Triton "
                             "kernels: it needs them (target.gpu_kernels=true)")

    @classmethod
    def emulated_gpu(cls) -> "Backend":
        """CPU forwards as a GPU runs them: torch's ops (no specdec kernels, no oneDNN), graphs replayed on CPU
        (:class:`~specdec.models.graphs.EmulatedGraph`), which fail where a CUDA graph would. For tests; slower
        than eager."""
        return cls(kernels=False, onednn=False, emulate_graphs=True, gpu_kernels=False)

    @classmethod
    def interpreted_gpu(cls, exact_numerics: bool = False) -> "Backend":
        """CPU forwards as a GPU runs them with specdec's Triton kernels (:mod:`~specdec.models.gpu_kernels`), the
        kernels under Triton's interpreter (``TRITON_INTERPRET=1`` set before Triton is imported), graphs emulated.
        For tests of the GPU's fused path on machines without a GPU; slow."""
        return cls(kernels=False, onednn=False, emulate_graphs=True, triton_on_cpu=True, exact_numerics=exact_numerics)

    def exact_kernels(self, x: torch.Tensor):
        """The Triton kernels whose :func:`~specdec.models.gpu_kernels.invariant_linear` runs products over ``x`` (a
        row's sum in one order whatever the number of rows): with :attr:`exact_numerics` where they take ``x``;
        else None."""
        if not self.exact_numerics or self.fusable(x):
            return None
        return self.fused_kernels(x)

    # ---- what the forwards ask --------------------------------------------------------------------------

    def replays_graphs(self, device: torch.device) -> bool:
        """Whether forwards on ``device`` replay graphs: a CUDA device, or the CPU where graphs are emulated."""
        return device.type == "cuda" or (self.emulate_graphs and device.type == "cpu")

    def fusable(self, x: torch.Tensor) -> bool:
        """Whether specdec's fused CPU kernels take ``x``: float32 on CPU, no autograd, not being traced by
        torch.compile, the kernels on and built (what :meth:`CompactDecoder._fused` and the EAGLE layer's ask first)."""
        return (x.device.type == "cpu" and x.dtype == torch.float32 and not torch.is_grad_enabled()
                and not torch.compiler.is_compiling() and self.kernels and cpu_kernels.available())

    def fused_kernels(self, x: torch.Tensor):
        """The kernel set a fused forward over ``x`` runs (both have the same calls: rms_norm, rope_qkv,
        cache_attention, silu_mul), or None for torch's ops: specdec's CPU kernels where :meth:`fusable`; on a CUDA
        device (or on CPU with :attr:`triton_on_cpu`) its Triton kernels, where Triton runs and :attr:`gpu_kernels`
        is on, for float32, float16 and bfloat16 without autograd and outside torch.compile."""
        if self.fusable(x):
            return cpu_kernels.module()
        if (not self.stacks(x) or not self.gpu_kernels or x.dtype not in _TRITON_DTYPES or torch.is_grad_enabled()
                or torch.compiler.is_compiling()):
            return None
        from specdec.models import gpu_kernels

        return gpu_kernels if gpu_kernels.available() else None

    @staticmethod
    def attends_in_kernel(kernels, rows: int) -> bool:
        """Whether a fused forward of ``rows`` new tokens (over the batch) runs its cache writes and attention through
        the kernel set ``kernels`` (:meth:`fused_kernels`): always on a GPU; on CPU a step of at most
        ``cpu_kernels.MAX_ROWS`` rows (a decode or verification step; a prefill takes SDPA there)."""
        return kernels is not cpu_kernels.module() or rows <= cpu_kernels.MAX_ROWS

    def stacks(self, x: torch.Tensor) -> bool:
        """Whether ``x`` is on the Triton kernels' devices (a CUDA device; the CPU with :attr:`triton_on_cpu`), where
        a fused forward reads its products' weights stacked once (q|k|v, gate|up) and runs them as one ``F.linear``
        each (:class:`Stacked`)."""
        return x.device.type == "cuda" or (self.triton_on_cpu and x.device.type == "cpu")

    def runs_as_accelerator(self, x: torch.Tensor) -> bool:
        """Whether products over ``x`` run as an accelerator runs them (``F.linear``, not the CPU's choices of kernel):
        ``x`` is on one, or on the CPU where this backend runs a GPU's ops (:meth:`emulated_gpu`)."""
        return x.device.type != "cpu" or self.emulate_graphs

    def linear(self, x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:  # x [..., in] -> [..., out]
        """``layer(x)``: ``F.linear`` on an accelerator; on CPU through specdec's few-row kernel or oneDNN where
        they apply (see :meth:`_cpu_product`), else computed as W·xᵀ with at least two rows.

        For the few rows of a decode step, MKL's x·Wᵀ path is 3-7x slower on CPU than W·xᵀ, and a single
        row is slowest of all (measured on the 49152x576 LM head: 9.7 ms for one row, 3.0 ms for two).
        Same arithmetic, another kernel.
        """
        exact = self.exact_kernels(x)
        if exact is not None:
            return exact.invariant_linear(x, layer.weight, layer.bias)
        if self.runs_as_accelerator(x):  # the CPU's choice below is not an accelerator's
            return F.linear(x, layer.weight, layer.bias)
        out = self._cpu_product(x, (layer,))
        if out is not None:
            return out
        flat = x.reshape(-1, x.shape[-1])
        rows = flat.shape[0]
        if rows == 1:
            flat = flat.repeat(2, 1)  # contiguous: a stride-0 operand takes a slow kernel
        # Contiguous [rows, out]: a transposed result sends SDPA down a slow copying path at batch > 1.
        out = torch.mm(layer.weight, flat.t()).t()[:rows].contiguous()
        if layer.bias is not None:
            out = out + layer.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])

    def linears(self, x: torch.Tensor, layers: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, ...]:
        """``tuple(layer(x) for layer in layers)`` for layers reading the same input (q/k/v, gate/up): on CPU one
        product over their stacked weights (:meth:`_cpu_product`), split; elsewhere :meth:`linear` per layer."""
        out = self._cpu_product(x, layers)
        if out is None:
            return tuple(self.linear(x, layer) for layer in layers)
        return out.split([layer.out_features for layer in layers], dim=-1)

    def step_product(self, x: torch.Tensor, entry: tuple) -> torch.Tensor:
        """x [M, in] through a product of a fused forward's plan (:meth:`ProductPlan.group`: prepared, layers):
        ``F.linear`` over weights :class:`Stacked` for a GPU; the few-row kernel over the prepared stacked weight for
        at most ``cpu_kernels.MAX_ROWS`` rows, else the layers stacked along the output (:meth:`_cpu_product`, else
        one by one)."""
        prepared, layers = entry
        if isinstance(prepared, Stacked):
            exact = self.exact_kernels(x)
            if exact is not None:
                return exact.invariant_linear(x, prepared.weight, prepared.bias)
            return F.linear(x, prepared.weight, prepared.bias)
        if prepared is not None and x.shape[0] <= cpu_kernels.MAX_ROWS:
            return cpu_kernels.panel_linear(x, *prepared)
        out = self._cpu_product(x, layers)
        return out if out is not None else torch.cat([self.linear(x, layer) for layer in layers], -1)

    def rows_product(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
        """x [M, K] · weight [N, K]ᵀ through the kernel where it applies (``cpu_kernels.rows_product``; a weight
        that is codes read as codes where :attr:`weights` is ``"codes"``), else None: Medusa's heads over the
        target's LM-head rows."""
        if not self.kernels:
            return None
        return cpu_kernels.rows_product(x, weight, codes=self.weights == "codes")

    def top_log_softmax(self, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``logits.log_softmax(-1).topk(k, dim=-1)`` as (values, indices) [..., k]: through the kernel where
        it applies (``cpu_kernels.top_log_softmax``; the Triton kernels' ``top_k`` where :meth:`gpu_top_k`), else
        torch's ops. A drafter's top-k over its vocabulary."""
        gpu = self.gpu_top_k(logits)
        if gpu is not None:
            return gpu.top_k(logits, k, log_softmax=True)
        if self.kernels:
            return cpu_kernels.top_log_softmax(logits, k)
        top = logits.log_softmax(-1).topk(k, dim=-1)
        return top.values, top.indices

    def top_k(self, logits: torch.Tensor, k: int, *, log_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The k largest of ``logits`` over the last dimension as (values float32, indices) [..., k], largest first:
        ``logits.float().topk(k)``, its values minus the row's ``logsumexp`` where ``log_probs`` (log-probabilities);
        through the Triton kernels' ``top_k`` where :meth:`gpu_top_k`. Tree candidates over a drafter's vocabulary."""
        gpu = self.gpu_top_k(logits)
        if gpu is not None:
            return gpu.top_k(logits, k, log_softmax=log_probs)
        logits = logits.float()
        top = logits.topk(k, dim=-1)
        if not log_probs:
            return top.values, top.indices
        return top.values - logits.logsumexp(-1, keepdim=True), top.indices

    def gpu_top_k(self, logits: torch.Tensor):
        """The Triton kernels (:mod:`~specdec.models.gpu_kernels`) whose ``top_k`` takes ``logits`` where a fused
        forward over them would run on those kernels (:meth:`fused_kernels`: a GPU's, or the interpreter's on CPU with
        :attr:`triton_on_cpu`), else None. On a GPU, torch's ``topk`` over a vocabulary of ~50k at a small batch runs
        its multi-block path, a few kernels a radix pass: the kernel is one or two (and needs no ``float()`` first)."""
        kernels = self.fused_kernels(logits)
        return kernels if kernels is not None and kernels is not cpu_kernels.module() else None

    def step_kernels(self, device: torch.device):
        """The Triton kernels (:mod:`~specdec.models.gpu_kernels`) that run a step's verdict, a tree's path move and
        the step's commit (``greedy_verdict``, ``sampled_verdict``, ``move_path``, ``commit_step``: 5 to ~180 small
        ops each in torch's)
        on ``device``: where a fused forward would run on them (a CUDA device; the CPU with :attr:`triton_on_cpu`) and
        :attr:`gpu_kernels` and :attr:`fused_steps` are on, outside torch.compile; else None (torch's ops)."""
        if (not self.gpu_kernels or not self.fused_steps or torch.compiler.is_compiling()
                or not (device.type == "cuda" or (self.triton_on_cpu and device.type == "cpu"))):
            return None
        from specdec.models import gpu_kernels

        return gpu_kernels if gpu_kernels.available() else None

    # ---- the weights as the kernels stream them ---------------------------------------------------------

    @property
    def panel_forms(self) -> tuple[bool, bool]:
        """The panel forms this backend packs (float16, codes): a plan packed under others is not its own."""
        return self.half_panels, self.weights == "codes"

    def streamed_bytes(self) -> dict[int, float]:
        """{id(weight): bytes} for the weights the kernel's products read from panels packed under this backend's
        forms: each weight's share of its stacked panels (float16 panels and codes stream fewer bytes than the
        float32 weight; see ``cpu_kernels.pack_codes``). What the speed of light counts for those weights."""
        shares: dict[int, float] = {}
        forms = (False, *self.panel_forms)
        for groups in list(_PACKED.values()):
            for key, (held, _, panels, _) in list(groups.items()):
                count = len(key) - len(forms)  # the key: the forms, then the stacked layers' ids
                weights = [ref() for ref in held[:count]]
                if key[:len(forms)] != forms or any(weight is None for weight in weights):
                    continue
                total = sum(weight.numel() for weight in weights)
                for weight in weights:
                    shares[id(weight)] = panels.numel() * panels.element_size() * weight.numel() / total
        return shares

    def prepare(self, layers: tuple[nn.Linear, ...], x: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor | None, bool] | None:
        """(the layers' weights stacked along the output, their biases stacked, whether the weight is prepacked
        for oneDNN), or None where the plain path runs (not CPU float32, autograd needed, inside torch.compile,
        neither the few-row kernel nor oneDNN on). With the kernel on, the stacked weight is packed in panels
        for it: as codes where they give the weight back exactly (``cpu_kernels.pack_codes``, where
        :attr:`weights` is ``"codes"``), else ``cpu_kernels.pack_panels`` (float16 panels where float16 holds the
        weight exactly and :attr:`half_panels` allows); with the kernel off, a oneDNN-packed copy. One product for
        q/k/v (or gate/up) instead of three (two) saves a call's overhead per layer, a tenth of a CPU decode
        step for SmolLM2-135M.

        Why oneDNN without the kernel: this CPU path is compute-bound past a few rows, and MKL picks slow kernels
        for the 2-32 rows of a verification step (on a 2-core AMD EPYC the 49152x576 LM head takes 14 ms for 16
        rows in MKL, 6 ms in oneDNN with a packed weight; a 16-token forward of SmolLM2-135M 90 → 65 ms, one
        token unchanged). The packed copy costs the weight's memory once per layer, is shared by every decoder
        over the same model, and is rebuilt when the weight changes (another tensor, dtype, device, or an
        in-place update)."""
        weights = [layer.weight for layer in layers]
        if (any(w.device.type != "cpu" or w.dtype not in _ONEDNN_DTYPES or x.dtype != w.dtype for w in weights)
                or (torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in weights)))
                or torch.compiler.is_compiling()):
            return None
        packed = not (self.kernels and cpu_kernels.available())
        if packed and not self._onednn():
            return None
        biases = [layer.bias for layer in layers]
        if any(b is not None for b in biases) and any(b is None for b in biases):
            return None  # mixed biases: computed one by one
        held = weights + list(layers) + [b for b in biases if b is not None]
        stamp = tuple(_version(w) for w in weights) + tuple(_version(b) for b in biases if b is not None)
        groups = _PACKED.get(layers[0])
        if groups is None:
            groups = _PACKED[layers[0]] = {}
        key = (packed, *self.panel_forms, *(id(layer) for layer in layers))  # a copy per kind, to compare
        entry = groups.get(key)
        if entry is None or entry[1] != stamp or len(entry[0]) != len(held) or any(
                ref() is not obj for ref, obj in zip(entry[0], held)):
            with torch.no_grad():
                stacked = weights[0].detach() if len(layers) == 1 else torch.cat([w.detach() for w in weights])
                bias = None if biases[0] is None else (biases[0].detach() if len(layers) == 1
                                                       else torch.cat([b.detach() for b in biases]))
                if packed:
                    stacked = torch.ops.mkldnn._reorder_linear_weight(stacked, None)
                else:
                    coded = cpu_kernels.pack_codes(stacked) if self.weights == "codes" else None
                    stacked = coded if coded is not None else cpu_kernels.pack_panels(
                        stacked, half=self.half_panels and cpu_kernels.exact_in_half(stacked))
                entry = ([weakref.ref(obj) for obj in held], stamp, stacked, bias)
            groups[key] = entry
        return entry[2], entry[3], packed

    def _onednn(self) -> bool:
        return self.onednn and _onednn_available()

    def _cpu_product(self, x: torch.Tensor, layers: tuple[nn.Linear, ...]) -> torch.Tensor | None:
        """x through the layers' weights stacked along the output ([..., sum of out]), or None where the plain
        path runs. Up to ``cpu_kernels.MAX_ROWS`` rows through specdec's few-row kernel over the stacked weight
        packed in panels (streams the weights at close to the machine's read bandwidth; rows bit-identical
        whatever their number), more rows (a prefill) through oneDNN over each layer's own weight; with the
        kernel off, oneDNN over a prepacked stacked weight."""
        prepared = self.prepare(layers, x)
        if prepared is None:
            return None
        weight, bias, packed = prepared
        if not packed:
            flat = x.reshape(-1, x.shape[-1])
            n = sum(layer.out_features for layer in layers)
            if flat.shape[0] <= cpu_kernels.MAX_ROWS:
                return cpu_kernels.panel_linear(flat, weight, bias, n).view(*x.shape[:-1], n)
            if not self._onednn():
                return None
            outs = [torch.ops.mkldnn._linear_pointwise(x.contiguous(), layer.weight.detach(),
                                                       None if layer.bias is None else layer.bias.detach(), "none",
                                                       [], "")
                    for layer in layers]
            return outs[0] if len(outs) == 1 else torch.cat(outs, -1)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")


@functools.cache
def _onednn_available() -> bool:
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def _version(weight: torch.Tensor) -> int:
    """The tensor's in-place update counter (-1 for an inference tensor, which has none and cannot be
    updated outside inference mode)."""
    try:
        return weight._version
    except RuntimeError:
        return -1


class ProductPlan:
    """The record behind a fused CPU forward's plan (:meth:`CompactDecoder._layer_plan`, the EAGLE layer's): the
    backend it was packed for and the submodules and parameters it was built from, with their versions, so that
    :meth:`current` says whether it still holds (the same backend, every one still in place, none updated in
    place since)."""

    def __init__(self, backend: Backend, dtype: torch.dtype, *, stacked: bool = False):
        self.backend = backend
        self.stacked = stacked  # the products' weights stacked for F.linear (:class:`Stacked`), not packed for CPU
        # what each recorded object was found as: its owner's store (a module's _modules or _parameters), name
        self.stores: list[dict] = []
        self.names: list[str] = []
        self.objects: list[object] = []
        self.tensors: list[torch.Tensor] = []  # the recorded parameters with an update counter, and its values
        self.versions: list[int] = []  # (an inference tensor has none: it cannot be updated outside inference mode)
        self.probe = torch.empty(1, 1, dtype=dtype)  # stands for the inputs in Backend.prepare's checks

    def current(self, backend: Backend) -> bool:
        """Whether the plan holds for forwards on ``backend``: packed for it, every recorded object still in place,
        no recorded tensor updated in place (~100 us for the target's 30 layers on a 2-core Skylake Xeon, once per
        forward)."""
        return (self.backend == backend
                and all(map(operator.is_, map(operator.getitem, self.stores, self.names), self.objects))
                and [tensor._version for tensor in self.tensors] == self.versions)

    def hold(self, owner: nn.Module, *names: str) -> list:
        """``owner``'s submodules or parameters ``names``, recorded."""
        found = []
        for name in names:
            store = owner._modules if name in owner._modules else owner._parameters
            obj = store[name]
            found.append(obj)
            self.stores.append(store), self.names.append(name), self.objects.append(obj)
            if isinstance(obj, torch.Tensor) and _version(obj) >= 0:
                self.tensors.append(obj), self.versions.append(obj._version)
        return found

    def group(self, owner: nn.Module, *names: str) -> tuple:
        """(the (panels, bias, outputs) of ``owner``'s linear layers ``names`` stacked, or None where the
        few-row kernel does not run them, the layers): an entry for :meth:`Backend.step_product`. A plan built
        ``stacked`` holds their weights stacked for ``F.linear`` instead (:class:`Stacked`)."""
        layers = tuple(self.hold(owner, *names))
        for linear in layers:
            self.hold(linear, *(name for name in ("weight", "bias") if linear._parameters.get(name) is not None))
        if self.stacked:  # one copy of the stacked weights, none for a single layer
            biases = [linear.bias for linear in layers]
            if any(b is None for b in biases) and any(b is not None for b in biases):
                return None, layers  # mixed biases: one product per layer
            with torch.no_grad():
                def stack(tensors):
                    return tensors[0].detach() if len(tensors) == 1 else torch.cat([t.detach() for t in tensors])
                return Stacked(stack([linear.weight for linear in layers]),
                               None if biases[0] is None else stack(biases)), layers
        prepared = self.backend.prepare(layers, self.probe)
        if prepared is None or prepared[2]:
            return None, layers
        return (*prepared[:2], sum(linear.out_features for linear in layers)), layers

    def norm(self, owner: nn.Module, name: str) -> tuple[torch.Tensor, float]:
        """(weight, eps) of ``owner``'s RMSNorm ``name`` (transformers' Llama norm or torch's nn.RMSNorm)."""
        module, = self.hold(owner, name)
        weight, = self.hold(module, "weight")
        return weight, rms_norm_eps(module)


def rms_norm_eps(module: nn.Module) -> float:
    """The epsilon an RMSNorm module adds (transformers' ``variance_epsilon`` or ``eps``, torch's ``eps``; torch's
    None means its dtype's machine epsilon)."""
    eps = module.variance_epsilon if hasattr(module, "variance_epsilon") else module.eps
    return float(torch.finfo(module.weight.dtype).eps if eps is None else eps)
