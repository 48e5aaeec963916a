"""Logging, the first phase of replay: one pass per (target, drafter, prompts, sampling settings) that records what any
lookahead K up to K_max (a chain) or the tree asked (a tree) needs, so that :mod:`specdec.replay.simulate` replays
them without the target.

Per prompt the log holds the target's *continuation* and the drafter's *proposal from every position* a live run
can stand at (position j: the first j new tokens emitted, the state's last token the j-th). The pass is the decode
loop itself (:func:`~specdec.speculative_generate`) with the drafter wrapped in a :class:`Recorder`: at each step
the drafter proposes K_max tokens (or its tree) from the state the loop gives it and the recorder keeps the
proposal. Greedy, it hands the loop an empty proposal, so every step is a plain decode step and the output is the
target's greedy continuation. At T > 0 (one pass per seed) the proposal is verified by :class:`AcceptanceRecorder`:
the target scores [last token, drafts] in the verify forward, which gives p_i given the drafts before draft i, the
drafter reported q_i (None: one-hot), and the recorder keeps each draft's acceptance probability under the exact
rule (:mod:`specdec.replay.acceptance`: a chain's β_i = Σ_x min(p_i(x), q_i(x)), p_i(x_i) when deterministic; a
fixed-candidate tree's p(token | path) per node), a few floats per (position, draft), never a [V] vector. It then
rejects every draft and emits a draw from the target's own distribution after the last token (its own generator,
seeded by the seed), so the continuation is plain sampling from the target. Either way the drafter sees the state
a live run standing at position j gives it (the tokens so far, the target's hidden state and features at the
committed positions), after steps that each kept one token.

Why one proposal per position is enough (a batch of one): every shipped drafter's proposal is a function of the
committed prefix alone (and, at T > 0, of its own draws). n-gram looks its suffix up in the tokens; the draft
model's cache holds the committed tokens (rolled back to ``seq_lens - 2`` each step); EAGLE's draft cache holds the
committed positions' features and rolls its drafts back; Medusa reads the target's last hidden state, which is the
hidden state at that position whatever the step boundaries. And a chain's first K drafts at K_max are its drafts
at K (each draft continues the ones before it; confidence cut-offs cut a prefix), which the tests check against
live runs. In exact arithmetic, that is; the live run computes those hidden states, features and draft caches in
forwards of other widths (a verify block of K+1 or a tree), whose float sums may differ in the last bits, and a
draft whose choice is a near tie (an argmax, a confidence threshold) could then differ. The key test
(tests/replay) finds none on the real target. What is history-dependent is modelled or refused: the draft model's ``schedule:
heuristic`` is logged at a fixed length and its length re-enacted by the replay from the steps' acceptance
(:func:`constant_length`; :func:`~specdec.replay.simulate.next_length`). Refused: batches (a tree's shape is chosen
over a batch's rows), lossy acceptance rules, and at T > 0 trees whose candidates are drawn at random (EAGLE's
``sampled`` trees: siblings drawn without replacement; their acceptance is not kept).

At T > 0, what is exact and what is not (replayed in :mod:`specdec.replay.simulate`):

- exact: every β of a deterministic drafter (n-gram, fixed-candidate trees: EAGLE's default with lookup, Medusa's),
  so the distribution of a step's accepted length from a logged position; for a drafter that samples its drafts
  (the draft model, EAGLE's chain, Medusa's chain) β_1;
- approximate: a sampled drafter's β_i for i >= 2 is taken given *its own* draws of drafts 1..i-1 (one draw each),
  while the rule reaches draft i only when those were accepted, i.e. drawn from min(p, q) / β rather than q; the
  product Π β_i then stands for P(accepted >= k);
- the continuation is one sample of the target per seed (``seeds``), not the continuation a live run draws: the
  replay's τ is an estimate whose spread over seeds is that of the prompts' sampled texts.

To replay a step the verifier compares the drafts with the target's tokens *after* them, which may lie past
``max_new_tokens`` or past an EOS (the live run cuts what it emits there, not what it accepts): the continuation is
logged ``margin`` tokens further (K_max for chains, the tree's size for trees) with EOS not stopping it.
"""

from __future__ import annotations

import hashlib
import json
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Iterator, Sequence

import torch

from specdec.decode.engine import speculative_generate
from specdec.drafters.base import DecodeState, Drafter, DrafterWrapper, Proposal, registered_name
from specdec.drafters.draft_model.core import ModelDrafter
from specdec.models.loading import stop_token_ids
from specdec.replay.acceptance import chain_acceptance, tree_acceptance
from specdec.replay.cost_model import CostModel
from specdec.verify.sampling import SamplingParams, sample

FORMAT = 3  # bumped when what a log holds changes: an older file is refused, not misread
# per-generation drafter state, left out of a drafter's identity: its caches, counters, graphs and wrapped drafter, the
# block drafter's newest context, a cross-vocabulary draft's held tokens, room and text origins
VOLATILE = {"cache", "forwards", "length", "proposed", "graphs", "config", "inner", "last", "held", "capacity", "origins"}


class ReplayMismatchError(ValueError):
    """A replay log does not fit the request: written for another target, drafter, tokenizer, prompts or settings,
    or asked for a lookahead or tree beyond what it holds."""


@dataclass
class Proposed:
    """One logged proposal: draft tokens, the tree's parent list (None: a chain), how many are genuine drafts, and
    the drafter's own forwards it took (its runtime's count: EAGLE's catch-up and tree levels, a draft model's steps;
    None: a drafter without a model, or a log written before they were counted), which a step-cost curve's drafting
    steps are built from (:meth:`ReplayLog.draft_forwards`)."""

    tokens: list[int]
    parents: list[int] | None
    num_proposed: int
    forwards: int | None = None


@dataclass
class PromptLog:
    """One prompt's log: ``continuation`` (the target's greedy new tokens, ``max_new_tokens`` + the margin, EOS not
    stopping it) and ``proposals[j - 1]``, the proposal from position j (j new tokens emitted), for every position a
    live run can stand at (j < ``max_new_tokens``, no EOS among the first j)."""

    prompt: list[int]
    continuation: list[int]
    proposals: list[Proposed]
    draft_times_s: list[float] = field(default_factory=list)  # seconds each proposal took (K_max, or the tree)
    # T > 0 only: per position, per draft (a chain's draft i, a tree's node) the probability that the exact rule
    # accepts it given the drafts before it (its ancestors) were: a chain's β_i = Σ_x min(p_i(x), q_i(x)), a
    # one-hot tree node's p(token | its path) (0 for a repeated sibling); empty when greedy
    accept_probs: list[list[float]] = field(default_factory=list)
    seed: int | None = None  # T > 0: the target's draws after the first token (that one and the drafter's: seed + 1)


@dataclass
class ReplayLog:
    """Everything a replay needs, and what it was logged from (``target``, ``drafter``, ``tokenizer``: identities
    that :meth:`check` compares with a request's)."""

    target: dict[str, Any]
    drafter: dict[str, Any]
    tokenizer: dict[str, Any] | None
    max_new_tokens: int
    temperature: float
    eos: list[int]
    k_max: int  # chains: the longest lookahead replayable; trees: the tree size logged
    tree: bool  # a tree drafter: replayable at k_max only
    prompts: list[PromptLog]
    costs: dict[str, Any] = field(default_factory=dict)  # cost models (specdec.replay.costs) by batch size (str)
    log_time_s: float = 0.0  # the logging pass's wall time
    top_k: int = 0  # the sampling settings the continuation and the drafts were drawn with (with temperature)
    top_p: float = 1.0
    seeds: int = 1  # T > 0: sampled continuations per prompt (``prompts`` holds them prompt by prompt)
    one_hot: bool = True  # every logged draft deterministic (probs None): the matching walk is exact too
    schedule: str = "constant"  # the draft length's schedule the replay re-enacts (logged at fixed lengths)
    format: int = FORMAT

    @property
    def sampling(self) -> dict[str, float]:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}

    def cost_model(self, batch_size: int = 1) -> CostModel | None:
        """The cost model measured at a batch of ``batch_size`` rows (None: not measured)."""
        data = self.costs.get(str(batch_size))
        return None if data is None else CostModel.from_dict(data)

    def draft_forwards(self, k: int) -> float | None:
        """The drafter's own forwards a proposal took, on average over the logged positions, at lookahead ``k``
        (a chain logged at K_max drafts its first k: at most k forwards; a tree: as logged). None where a proposal
        holds no count."""
        counts = [p.forwards for log in self.prompts for p in log.proposals]
        if not counts or any(c is None for c in counts):
            return None
        return sum(c if self.tree else min(c, k) for c in counts) / len(counts)

    def timed_by(self, costs: CostModel) -> ReplayLog:
        """This log timed by ``costs`` at its batch size (a step-cost curve's, say) in place of what was measured: a
        copy for the replay, never saved."""
        return replace(self, costs={str(costs.batch_size): asdict(costs)})

    def check(self, *, target: dict | None = None, drafter: dict | None = None, tokenizer: dict | None = None,
              k: int | None = None, sampling: dict | None = None, path: str | Path | None = None) -> None:
        """Refuse (:class:`ReplayMismatchError`, naming both) a request this log does not answer. ``sampling``:
        temperature, top_k, top_p (a log answers the settings it was drawn with only); ``path``: the log's file,
        named in the refusal (the file to delete)."""
        where = (f": delete {str(path)!r} and the next run logs again" if path is not None
                 else " (specdec.replay.log_proposals)")
        for what, mine, theirs in (("target", self.target, target), ("drafter", self.drafter, drafter),
                                   ("tokenizer", self.tokenizer, tokenizer),
                                   ("sampling", self.sampling, None if sampling is None else _sampling(**sampling))):
            if theirs is not None and _normal(mine) != _normal(theirs):
                raise ReplayMismatchError(
                    f"this replay log was written for another {what}: logged {_brief(mine)}, asked for "
                    f"{_brief(theirs)}; log again with this {what}{where}")
        if k is None:
            return
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k (lookahead) must be an integer >= 1, got {k!r}")
        if self.tree and k != self.k_max:
            raise ReplayMismatchError(f"this log holds {self.drafter.get('name')}'s trees of k={self.k_max} nodes, "
                                      f"asked for k={k}: a tree of another size is another tree; log again at k={k}")
        if k > self.k_max:
            raise ReplayMismatchError(f"this log holds chains up to K_max={self.k_max} drafts, asked for k={k}; "
                                      f"log again with k_max >= {k}")

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(path)  # a crash mid-write leaves no half log under the real name
        return path

    @classmethod
    def load(cls, path: str | Path) -> "ReplayLog":
        """The log in the file at ``path``; a :class:`ReplayMismatchError` naming the file (delete it: the next run
        logs again) when it is not one this specdec reads: truncated, corrupt, of another format."""
        redo = "delete it and the next run logs again"
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # ValueError: JSONDecodeError, UnicodeDecodeError
            raise ReplayMismatchError(f"replay log {str(path)!r} cannot be read ({type(exc).__name__}: {exc}): "
                                      f"truncated or corrupt; {redo}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ReplayMismatchError(f"{str(path)!r} is not a replay log this specdec reads (format {found!r}, "
                                      f"expected {FORMAT}); {redo}")
        try:
            data["prompts"] = [PromptLog(**{**p, "proposals": [Proposed(**q) for q in p["proposals"]]})
                               for p in data["prompts"]]
            return cls(**data)
        except (KeyError, TypeError) as exc:
            raise ReplayMismatchError(f"replay log {str(path)!r} is missing or has malformed fields ({exc!r}); "
                                      f"{redo}") from None


def _sampling(temperature: float, top_k: int = 0, top_p: float = 1.0) -> dict[str, float]:
    return {"temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p)}


def _normal(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True))  # tuples as lists, as a saved log holds them


def _brief(identity: dict) -> str:
    return json.dumps(identity, sort_keys=True)[:400]


def _fingerprint(tensors: Sequence[torch.Tensor]) -> str:
    """A short hash of the tensors' shapes and leading values (enough to tell two sets of weights apart)."""
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(str((tuple(tensor.shape), str(tensor.dtype))).encode())
        digest.update(tensor.detach().reshape(-1)[:4096].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def target_identity(target: torch.nn.Module) -> dict[str, Any]:
    """What tells one target from another in a log: its name, sizes and a fingerprint of its weights, and
    whether its CPU forwards stream codes (its decoder's backend: other numerics, possibly another greedy
    continuation)."""
    from specdec.models import CompactDecoder, GraphedDecoder, as_decoder

    decoder = as_decoder(target)
    codes = isinstance(decoder, (CompactDecoder, GraphedDecoder)) and decoder.backend.weights == "codes"
    config = getattr(target, "config", None)
    return {"name": str(getattr(config, "_name_or_path", "") or type(target).__name__),
            "vocab_size": getattr(config, "vocab_size", None), "layers": getattr(config, "num_hidden_layers", None),
            "weights": _fingerprint(list(target.parameters())), "codes": codes}


def drafter_identity(drafter: Drafter, *, chain_k_free: bool = True) -> dict[str, Any]:
    """What tells one drafter from another: its name, its config (without ``k`` for a chain: a log's K_max covers
    every smaller one), its settings and a fingerprint of its weights."""
    config = drafter.config
    if config is not None and not isinstance(config, dict):
        config = asdict(config) if is_dataclass(config) else _config_dict(config)
    if config is not None and chain_k_free:
        config = {key: value for key, value in config.items() if key != "k"}
    settings, weights = {}, []
    for key, value in vars(drafter).items():
        if key in VOLATILE or key.startswith("_"):
            continue
        if isinstance(value, torch.nn.Module):
            weights += list(value.parameters())
        elif isinstance(value, torch.Tensor):
            weights.append(value)
        elif isinstance(value, (bool, int, float, str, type(None))) or (
                isinstance(value, (list, tuple)) and all(isinstance(v, (int, float, str, list, tuple)) for v in value)):
            settings[key] = value
    return {"name": registered_name(drafter), "class": type(drafter).__name__, "config": config,
            "settings": settings, "weights": _fingerprint(weights) if weights else None}


def _config_dict(config: Any) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(config, resolve=True)


def tokenizer_identity(tokenizer: Any) -> dict[str, Any] | None:
    """What tells one tokenizer from another: its name, size and a hash of its vocabulary (None: no tokenizer)."""
    if tokenizer is None:
        return None
    vocab = json.dumps(sorted(tokenizer.get_vocab().items())).encode()
    return {"name": str(getattr(tokenizer, "name_or_path", "")), "size": len(tokenizer),
            "vocab": hashlib.sha256(vocab).hexdigest()[:16]}


def log_key(target: dict, drafter: dict, tokenizer: dict | None, prompts: Sequence[Sequence[int]],
            max_new_tokens: int, sampling: dict, eos: Sequence[int], k_max: int, seeds: int = 1) -> str:
    """The cache key of a log: a hash of everything it was logged from (``sampling``: temperature, top_k, top_p;
    ``seeds``: sampled continuations per prompt, counted only at T > 0)."""
    sampling = _sampling(**sampling)
    what = {"target": target, "drafter": drafter, "tokenizer": tokenizer, "prompts": [list(p) for p in prompts],
            "max_new_tokens": max_new_tokens, "sampling": sampling, "eos": sorted(eos), "k_max": k_max,
            "seeds": seeds if sampling["temperature"] else 1, "format": FORMAT}
    return hashlib.sha256(json.dumps(_normal(what), sort_keys=True).encode()).hexdigest()[:24]


class Recorder(DrafterWrapper):
    """Wraps a drafter for the logging pass: at each step it asks ``inner`` for ``k`` drafts from the loop's state,
    keeps them (and how long that took). Greedy, it proposes nothing, so the step is a plain decode step; sampled
    (``sampled``), it proposes them and :class:`AcceptanceRecorder` verifies them: the step keeps their acceptance
    probabilities, rejects them all and emits the target's own draw. From position ``stop`` on (or once an EOS
    was emitted: no live run stands there) it no longer asks."""

    reads_host = True  # the host's tokens, each step

    def __init__(self, inner: Drafter, k: int, stop: int, eos: set[int], *, sampled: bool = False):
        super().__init__(inner)
        self.k, self.stop, self.eos, self.sampled = k, stop, eos, sampled
        self.prompt_len = 0
        self.reached = False  # whether this step's proposal is logged (its acceptance probabilities too)
        self.one_hot = True  # every proposal so far deterministic
        self.proposals: list[Proposed] = []
        self.times: list[float] = []
        self.accept_probs: list[list[float]] = []

    def begin(self, prompt_len: int) -> None:
        """A new prompt (``prompt_len`` tokens) is logged next."""
        self.prompt_len, self.proposals, self.times, self.accept_probs = prompt_len, [], [], []

    def propose(self, state: DecodeState, k: int) -> Proposal:
        if len(state.tokens) != 1:
            raise ValueError(f"replay logs one prompt at a time, got a batch of {len(state.tokens)}")
        row = state.tokens[0]
        position = len(row) - self.prompt_len  # new tokens emitted
        self.reached = position == len(self.proposals) + 1 and position < self.stop and self.eos.isdisjoint(
            row[self.prompt_len:])
        empty = Proposal(tokens=state.last_tokens.new_zeros(1, 0), num_proposed=[0])
        if not self.reached:
            return empty
        device = state.last_tokens.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start, before = time.perf_counter(), None if self.runtime is None else self.runtime.forwards
        proposal = self.inner.propose(state, self.k)
        tokens = proposal.tokens[0].tolist()
        self.times.append(time.perf_counter() - start)
        forwards = None if before is None else self.runtime.forwards - before
        if proposal.probs is not None:
            if not self.sampled:
                raise ValueError(f"{type(self.inner).__name__} drew its drafts from a distribution at temperature 0")
            if proposal.tree is not None:
                raise ValueError(f"{type(self.inner).__name__} drew its tree's nodes at random (draws without "
                                 f"replacement): replay at T > 0 takes trees of fixed candidates only; set "
                                 f"drafter.sampled=false, or drafter.tree=false for a chain")
            self.one_hot = False
        num = proposal.genuine()[0]
        parents = None if proposal.tree is None else list(proposal.tree.parent_list)
        self.proposals.append(Proposed(tokens, parents, num, forwards))
        if not self.sampled:
            return empty
        if not tokens:
            self.accept_probs.append([])
        return proposal


@dataclass
class AcceptanceRecorder:
    """The logging pass's acceptance rule at T > 0 (an :class:`~specdec.verify.AcceptanceRule`): it keeps, for a
    step :class:`Recorder` logs, each draft's acceptance probability given the drafts before it
    (:mod:`specdec.replay.acceptance`, from the p and q the verify forward gives), then rejects every draft and
    emits a draw from the target's distribution after the last token, with its own ``generator``: the
    continuation is plain sampling from the target."""

    recorder: Recorder
    generator: torch.Generator
    lossy: ClassVar[bool] = False

    def chain(self, draft_tokens, draft_probs, target_probs, generator=None):  # [1, K], [1, K, V]|None, [1, K+1, V]
        if self.recorder.reached and draft_tokens.shape[1]:
            self.recorder.accept_probs.append(chain_acceptance(draft_tokens, draft_probs, target_probs)[0].tolist())
        return self._rejected(target_probs), sample(target_probs[:, 0], self.generator)

    def tree(self, tree, draft_tokens, draft_probs, target_probs, generator=None):  # [1, N], -, [1, N+1, V]
        if self.recorder.reached:
            self.recorder.accept_probs.append(tree_acceptance(tree, draft_tokens, target_probs)[0].tolist())
        nodes = torch.full((target_probs.shape[0], tree.max_depth), -1, dtype=torch.long, device=target_probs.device)
        return nodes, self._rejected(target_probs), sample(target_probs[:, 0], self.generator)

    @staticmethod
    def _rejected(target_probs: torch.Tensor) -> torch.Tensor:  # [B] long zeros
        return torch.zeros(target_probs.shape[0], dtype=torch.long, device=target_probs.device)


def drafts_trees(drafter: Drafter) -> bool:
    """Whether ``drafter``'s config asks for trees (EAGLE's ``tree: true``, Medusa's tree of paths): its log then
    replays at the logged size only. A drafter built by its constructor has no config: its log is a tree log when
    any proposal logged was a tree."""
    return bool(getattr(drafter.config, "tree", None))


def check_replayable(drafter: Drafter, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0) -> None:
    """Refuse what replay cannot reproduce from one proposal per position (see the module docstring)."""
    SamplingParams(temperature, top_k, top_p)
    if drafter.traits.lossy:
        raise ValueError(f"{type(drafter).__name__} verifies with a lossy rule ({drafter.traits.acceptance!r}); replay "
                         f"models the exact rule only: build it with drafter.acceptance=exact")
    schedule = draft_schedule(drafter)
    if schedule not in SCHEDULES:
        raise ValueError(f"drafter.schedule={schedule!r}: replay re-enacts {list(SCHEDULES)} only; use one of them")


SCHEDULES = ("constant", "heuristic")  # the draft lengths a replay re-enacts (simulate.next_length)


def _unwrapped(drafter: Drafter) -> Drafter:
    """The drafter ``drafter`` wraps (through every wrapper), or itself: the one that keeps a schedule."""
    while isinstance(drafter, DrafterWrapper):
        drafter = drafter.inner
    return drafter


def draft_schedule(drafter: Drafter) -> str:
    """``drafter``'s draft length schedule, as built: ``constant`` (a proposal as long as asked) or a draft model's
    ``heuristic`` (+2 after a step that kept every draft, else -1; at most k)."""
    owner = _unwrapped(drafter)
    return str(owner.schedule) if isinstance(owner, ModelDrafter) else "constant"


@contextmanager
def constant_length(drafter: Drafter) -> Iterator[None]:
    """``drafter`` proposing as many drafts as it is asked for inside the block: a ``heuristic`` schedule set aside
    (and its length forgotten on either side), so that the logging pass logs every position at K_max and the cost
    model times each K at K; the replay re-enacts the schedule (:func:`~specdec.replay.simulate.next_length`)."""
    owner, schedule = _unwrapped(drafter), draft_schedule(drafter)
    if schedule == "constant":
        yield
        return
    owner.schedule, owner.length = "constant", None
    try:
        yield
    finally:
        owner.schedule, owner.length = schedule, None


def log_proposals(target, drafter: Drafter, prompts: Sequence[Sequence[int]], *, k_max: int, max_new_tokens: int,
                  tokenizer: Any = None, eos_token_id: int | Sequence[int] | None = None, temperature: float = 0.0,
                  top_k: int = 0, top_p: float = 1.0, seeds: int | Sequence[int] = 1,
                  tree: bool | None = None) -> ReplayLog:
    """The logging pass (see the module docstring) over ``prompts`` (token ids, one generation each): the target's
    continuation and ``drafter``'s proposal of ``k_max`` drafts (a chain's K_max, or a tree's size) from every
    position; at temperature > 0 (with ``top_k``, ``top_p``) the continuation is sampled, once per seed of
    ``seeds`` (a count n: seeds 0 .. n-1; or the seeds), and each draft's acceptance probability is kept.
    ``tree``: whether ``drafter`` drafts trees (None: from its config's ``tree`` and what it proposed); a tree
    log replays at ``k_max`` only. ``eos_token_id``: None = the target's own stop tokens."""
    check_replayable(drafter, temperature, top_k, top_p)
    if isinstance(k_max, bool) or not isinstance(k_max, int) or k_max < 1:
        raise ValueError(f"k_max (the longest lookahead to replay) must be an integer >= 1, got {k_max!r}")
    sampled = temperature != 0
    seed_list = [None] if not sampled else list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    if not seed_list:
        raise ValueError(f"seeds must be a count >= 1 or a non-empty list of seeds, got {seeds!r}")
    eos = sorted(set(stop_token_ids(target) if eos_token_id is None else
                     [eos_token_id] if isinstance(eos_token_id, int) else eos_token_id))
    recorder = Recorder(drafter, k_max, max_new_tokens, set(eos), sampled=sampled)
    logs, start = [], time.perf_counter()
    device = next(target.parameters()).device
    with constant_length(drafter):  # a schedule's proposals logged at K_max (the replay re-enacts it)
        for prompt in prompts:
            ids = torch.as_tensor(list(prompt), dtype=torch.long, device=device)[None]
            for seed in seed_list:
                recorder.begin(ids.shape[1])
                options: dict[str, Any] = {}
                if sampled:  # the target's draws and the drafter's from two streams: the continuation is the seed's
                    drafts = torch.Generator(device=device).manual_seed(seed + 1)
                    rule = AcceptanceRecorder(recorder, torch.Generator(device=device).manual_seed(seed))
                    options = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=drafts, rule=rule)
                # EOS must not stop it: drafts are checked past one
                out = speculative_generate(target, recorder, ids, k=k_max, max_new_tokens=max_new_tokens + k_max,
                                           eos_token_id=[], **options)
                logs.append(PromptLog(list(map(int, prompt)), out.sequences[0], recorder.proposals, recorder.times,
                                      recorder.accept_probs, seed))
    log_time = time.perf_counter() - start
    tree = (drafts_trees(drafter) if tree is None else tree) or any(
        p.parents is not None for log in logs for p in log.proposals)
    return ReplayLog(target_identity(target), drafter_identity(drafter, chain_k_free=not tree),
                     tokenizer_identity(tokenizer), max_new_tokens, float(temperature), eos, k_max, tree, logs,
                     log_time_s=log_time, top_k=int(top_k), top_p=float(top_p), seeds=len(seed_list),
                     one_hot=recorder.one_hot, schedule=draft_schedule(drafter))
