"""The drafter protocol and registry.

A drafter is a typed config and three calls (after transformers' ``CandidateGenerator``): :meth:`Drafter.from_config`
builds it; :meth:`Drafter.propose` gives up to K draft tokens per row with the distribution each was drawn from (or
``None`` when it chose them deterministically, i.e. one-hot q); :meth:`Drafter.observe` hears what the verifier kept,
so the drafter can roll its own state back or adapt. :meth:`Drafter.start` (optional) begins a generation. What the
decode loop reads of a drafter beyond these calls is data with defaults, :class:`Traits` (a lossy acceptance rule,
target features it reads, how it samples a tree's children, the lookaheads it drafts at), and a drafter with models
of its own holds a :class:`DraftRuntime` (their backend, forwards counted, graphs replayed). The decode loop never
branches on which drafter it runs, and never probes one for a member.
"""

from __future__ import annotations

import dataclasses
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import torch

from specdec.models.backend import Backend
from specdec.models.graphs import Graphs, check_compile_mode
from specdec.verify.sampling import SamplingParams

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from specdec.drafters.trees.siblings import SiblingDraws
    from specdec.verify import AcceptanceRule, Tree


@dataclass
class Proposal:
    tokens: torch.Tensor  # [B, K'] long, K' <= K (K' = 0 proposes nothing: a plain decode step)
    probs: torch.Tensor | None = None  # [B, K', V] the draft distributions q; None = deterministic drafts
    num_proposed: list[int] | None = None  # per row, how many of the K' are genuine (the rest is filler)
    tree: Tree | None = None  # the K' tokens form this tree (node i = tokens[:, i]); None = a chain
    # [B] long on the device: the genuine drafts counted there (a drafter that proposes from the device alone), read
    # back with the step's results; replaces num_proposed where given
    counted: torch.Tensor | None = None

    def genuine(self) -> list[int]:
        """Per row, how many drafts are genuine, on the host (reading ``counted`` back: a synchronisation)."""
        if self.counted is not None:
            return self.counted.tolist()
        return self.num_proposed or [self.tokens.shape[1]] * self.tokens.shape[0]


@dataclass
class DecodeState:
    """What the decode loop shares with a drafter. Updated in place after every verify step.

    Slot layout as in :class:`specdec.models.cache.KVCache`: row b's tokens sit at slots ``pad[b] ..
    seq_lens[b] - 1`` of ``seq``; the target cache holds all of them but the last (``last_tokens``).
    """

    seq: torch.Tensor  # [B, W] long: left padding, prompt, emitted tokens; W >= capacity (the target cache's
    # slots: a graphed decoder keeps one width over generations, which graphs reading seq are captured for)
    seq_lens: torch.Tensor  # [B] long: filled slots per row, padding included
    pad: torch.Tensor  # [B] long: left-padding slots per row
    last_tokens: torch.Tensor  # [B] long: newest token per row (not yet in the target's cache)
    last_hidden: torch.Tensor  # [B, H]: target's final hidden state where last_tokens was predicted
    num_accepted: torch.Tensor | None  # [B] long: accepted drafts at the last verify (None before one)
    tokens: list[list[int]]  # host mirror: per row, prompt (no padding) + emitted tokens
    active: list[bool]  # rows still generating
    max_seq_len: int  # host: max(seq_lens), a bound for attention spans without a device sync
    capacity: int  # slots per row in every cache of this generation
    vocab_size: int  # the target's
    sampling: SamplingParams
    generator: torch.Generator | None
    # The target's hidden states at the layers the drafter asked for (``Traits.feature_layers``, concatenated:
    # [B, T, len(layers) * H]) at every position committed since the drafter last saw them: after the prefill
    # the prompt's slots 0 .. S-1 (padding included), after a verify step the slots ``seq_lens - count - 1 + j``
    # (the old last token, then the accepted drafts). Entries past a row's count are stale. None = not asked.
    features: torch.Tensor | None = None


GRAPHED_CATCH_UP = 16  # catch-ups of at most this many positions replay graphs (the first, the prompt's: eager)


def replays_catch_up(runtime: "DraftRuntime", state: DecodeState) -> bool:
    """Whether a drafter's catch-up on ``state.features`` replays a graph: where its work replays graphs, after a
    verify step (the prompt's catch-up, as long as the prompt, is eager: a short prompt's would be captured again
    for each prompt length) and over at most :data:`GRAPHED_CATCH_UP` positions."""
    return (runtime.graphs is not None and state.num_accepted is not None
            and state.features.shape[1] <= GRAPHED_CATCH_UP)


@dataclass(frozen=True)
class Traits:
    """What the decode loop reads of a drafter beyond its calls, as data (frozen: a drafter or a planted bug that
    changes one sets a new instance, ``dataclasses.replace``). The defaults suit a drafter that reads no
    target features, drafts at any lookahead, draws no tree children and is verified by the exact rule."""

    acceptance: AcceptanceRule | None = None
    """None: exact verification; else a LOSSY rule verified with instead (Medusa's typical acceptance)."""
    feature_layers: tuple[int, ...] = ()
    """Target layers whose hidden states the drafter reads at every committed position (``DecodeState.features``)."""
    siblings: SiblingDraws | None = None
    """How the drafter draws a tree's children and reports their q when it samples them (at temperature > 0); the
    planted drafter-side tree bugs replace it. None: it never samples them (fixed candidates, one-hot q)."""
    sizes: range | None = None
    """The lookaheads it drafts at (drafter.k=auto tries no other); None: any k >= 1."""
    device_only: bool = False
    """Whether it proposes from the device's state alone (never the host's ``tokens`` or ``active``; what it reads
    back, if anything, is its own work's: EAGLE's sampled tree) and its :meth:`~Drafter.observe` does nothing: then
    the decode loop may launch a step before reading the last (on a GPU: the host's bookkeeping runs while the device
    computes)."""

    @property
    def lossy(self) -> bool:
        """Whether runs with this drafter change the output distribution (a lossy acceptance rule)."""
        return self.acceptance is not None and self.acceptance.lossy

    def samples_siblings(self, params: SamplingParams) -> bool:
        """Whether the drafter's trees have sampled children (through :attr:`siblings`) under ``params``."""
        return self.siblings is not None and not params.greedy

    def drafts_at(self, k: int) -> bool:
        """Whether the drafter drafts at lookahead ``k``."""
        return k >= 1 if self.sizes is None else k in self.sizes


class DraftRuntime:
    """How a drafter's own models run: the ``backend`` of their CPU forwards (a job gives it the target's), their
    forwards this generation (the drafter counts them, the decode loop zeroes and reports them), and the graphs
    that replay their work where the target's forwards replay graphs.

    ``device()``: where that work could replay graphs (the models' device), read when graphs are set up; None:
    nothing worth replaying. ``route(graphs, compile)``: hands the graphs to the parts that replay them (``compile``:
    compile what is captured, where it can); without it the drafter replays through :meth:`call` and
    :meth:`new_cache`."""

    def __init__(self, backend: Backend = Backend(), device: Callable[[], torch.device | None] = lambda: None,
                 route: Callable[[Graphs, bool], None] | None = None):
        self.backend, self.device, self.route = backend, device, route
        self.graphs: Graphs | None = None  # set by replay_graphs; None: the work runs eagerly
        self.forwards = 0

    def replay_graphs(self, mode: str) -> None:
        """Run the drafter's own work as the target's forwards run (``target.compile``'s ``mode``), once built."""
        check_compile_mode(mode)  # see specdec.models.target_decoder
        device = self.device()
        if mode != "none" and device is not None and self.backend.replays_graphs(device):
            self.graphs = Graphs(device, emulate=self.backend.emulate_graphs)
            if self.route is not None:
                self.route(self.graphs, mode == "compiled_graphs")

    def runners(self) -> list[Graphs]:
        """What replays the work (their ``captures``, ``replays``, ``capture_time_s``); [] where it runs eagerly."""
        return [] if self.graphs is None else [self.graphs]

    def call(self, fn, inputs: tuple[torch.Tensor, ...], key) -> tuple[torch.Tensor, ...]:
        """``fn(*inputs)``: replayed as a graph where :meth:`replay_graphs` set them up (``key``: what else fixes
        ``fn``), else eager."""
        return fn(*inputs) if self.graphs is None else self.graphs(fn, inputs, key=key)

    def new_cache(self, make, batch: int, capacity: int, pad: torch.Tensor):
        """The draft cache of a generation (``make(batch, capacity, pad)``, the model's ``new_cache``): a new one,
        or with graphs the one they keep (:meth:`Graphs.cache`: their graphs read its memory)."""
        return make(batch, capacity, pad) if self.graphs is None else self.graphs.cache(make, batch, capacity, pad)


class Drafter(ABC):
    """Base class of every drafting strategy (see the module docstring). A drafter sets :attr:`Config` and implements
    :meth:`from_config`, :meth:`propose` and :meth:`observe`; :meth:`start`, :attr:`traits` and :attr:`runtime` have
    defaults that suit a drafter with no model of its own, no target features to read and the exact rule."""

    Config: ClassVar[type]
    """The drafter's typed Hydra config, a :class:`specdec.config.DrafterConfig` subclass."""

    @classmethod
    @abstractmethod
    def from_config(cls, cfg: Any, target: torch.nn.Module, tokenizer: Any = None,
                    backend: Backend = Backend()) -> Drafter:
        """The drafter ``cfg`` (its :attr:`Config`) describes, drafting for ``target`` (and its ``tokenizer``), its
        own models on ``backend`` (the target's, in a job)."""

    @abstractmethod
    def propose(self, state: DecodeState, k: int) -> Proposal:
        """Up to ``k`` draft tokens per row continuing ``state``."""

    @abstractmethod
    def observe(self, state: DecodeState) -> None:
        """The verifier kept ``state.num_accepted`` drafts per row and the state now includes them."""

    def start(self, state: DecodeState) -> None:
        """A generation begins: the prompt is in the target's cache and its first token emitted. A drafter with
        state drops the last generation's here."""

    config: Any = None
    """The config it was built from (set by :func:`~specdec.drafters.loading.build_drafter`); its ``k`` is the
    lookahead :func:`~specdec.speculative_generate` drafts with unless given one. None: built by its constructor."""
    traits: Traits = Traits()
    """What the decode loop reads of it beyond its calls (a drafter with other traits sets its own instance)."""
    runtime: DraftRuntime | None = None
    """Its own models' backend, forwards and graphs; None: it has no model (n-gram lookup)."""


def graph_runners(drafter: Drafter) -> list[Graphs]:
    """What replays ``drafter``'s own work as graphs; [] where it has no model or runs it eagerly."""
    return [] if drafter.runtime is None else drafter.runtime.runners()


def registered_name(drafter: Drafter) -> str:
    """The name configs build ``drafter``'s class (or the registered class it derives from) by, else its class's."""
    names = {cls: name for name, cls in DRAFTERS.items()}
    return next((names[cls] for cls in type(drafter).__mro__ if cls in names), type(drafter).__name__)


class DrafterWrapper(Drafter):
    """A drafter around ``inner`` (to record or alter what it sees): it drafts through ``inner`` and shares its
    config, traits and runtime, so the decode loop verifies with ``inner``'s rule, gives it its feature layers and
    counts its forwards and graph captures (one that reads the host each step, :attr:`reads_host`, is read each step);
    a subclass overrides what it alters. Built around a drafter, never from a config."""

    reads_host: ClassVar[bool] = False
    """Whether it reads the host's ``tokens`` or ``active`` (a recorder): then its traits say it does not propose from
    the device alone, whatever ``inner`` does, and the decode loop reads each step back before the next."""

    def __init__(self, inner: Drafter):
        self.inner = inner
        self.config, self.runtime = inner.config, inner.runtime
        self.traits = dataclasses.replace(inner.traits, device_only=False) if self.reads_host else inner.traits

    @classmethod
    def from_config(cls, cfg: Any, target: torch.nn.Module, tokenizer: Any = None,
                    backend: Backend = Backend()) -> Drafter:
        raise TypeError(f"{cls.__name__} wraps a drafter: build the inner one (build_drafter) and pass it in")

    def propose(self, state: DecodeState, k: int) -> Proposal:
        return self.inner.propose(state, k)

    def observe(self, state: DecodeState) -> None:
        self.inner.observe(state)

    def start(self, state: DecodeState) -> None:
        self.inner.start(state)


def round_weights(module: torch.nn.Module, bits: int | None, *, keep: tuple[torch.Tensor, ...] = (),
                  what: str = "drafter") -> int:
    """A drafter's ``drafter.weight_bits``: round the weight of every linear layer of ``module`` in place to the
    nearest 8- or 4-bit codes per block of 32 inputs (``cpu_kernels.round_to_codes``), which the CPU kernels
    then stream as codes (1.125 or 0.75 bytes a weight). Lossy for the drafts only: verification still checks
    every draft against the target, so the output stays exact. ``None`` leaves the weights as they are.
    Weights in ``keep`` (the target's, shared) and those whose input size is not a multiple of 32 stay.
    Logs and returns how many weights were rounded (``what``: whose, for the log)."""
    from specdec.models import cpu_kernels

    if bits is None:
        return 0
    if isinstance(bits, bool) or bits not in cpu_kernels.CODE_BITS:
        raise ValueError(f"drafter.weight_bits must be 4, 8 or null (the weights as trained), got {bits!r}")
    kept = {tensor.data_ptr() for tensor in keep}
    rounded = 0
    with torch.no_grad():
        for layer in module.modules():
            weight = getattr(layer, "weight", None) if isinstance(layer, torch.nn.Linear) else None
            if (weight is None or weight.data_ptr() in kept or weight.dtype != torch.float32
                    or weight.shape[1] % cpu_kernels.CODE_BLOCK):
                continue
            weight.copy_(cpu_kernels.round_to_codes(weight, bits))
            rounded += 1
    log.info("%s: %d weights rounded to %d-bit codes (drafter.weight_bits)", what, rounded, bits)
    return rounded


DRAFTERS: dict[str, type[Drafter]] = {}


class NoDrafter(Drafter):
    """Proposes nothing: every step is a plain decode step (plain decoding on the speculative path; a base for
    what records the target's steps, e.g. the training data's hidden states)."""

    @classmethod
    def from_config(cls, cfg, target, tokenizer=None, backend=Backend()) -> "NoDrafter":
        return cls()

    def propose(self, state: DecodeState, k: int) -> Proposal:
        return Proposal(tokens=state.last_tokens.new_zeros(len(state.active), 0), num_proposed=[0] * len(state.active))

    def observe(self, state: DecodeState) -> None:
        """Nothing drafted, nothing to roll back."""


def register(name: str) -> Callable[[type[Drafter]], type[Drafter]]:
    """Class decorator: make a drafter buildable from a config whose ``name`` is ``name``; its typed config
    (``Config``) is stored as Hydra's ``drafter/<name>_schema``, which ``configs/drafter/<name>.yaml`` builds on."""

    def wrap(cls: type[Drafter]) -> type[Drafter]:
        DRAFTERS[name] = cls
        schema = getattr(cls, "Config", None)
        if schema is not None:
            from hydra.core.config_store import ConfigStore

            ConfigStore.instance().store(group="drafter", name=f"{name}_schema", node=schema)
        return cls

    return wrap
