"""Medusa heads (Cai et al. 2024): H small heads on the target's last hidden state, no draft model.

Head i (i = 0..H-1) reads the target's final hidden state at the position that predicted token t+1 —
``DecodeState.last_hidden``, where ``last_tokens`` was predicted — and proposes token t+2+i. Each head is
a residual block h + SiLU(W h + b) followed by the target's own LM head (frozen and shared; an own LM
head per Medusa head is an option). W and b start at zero, so an untrained head repeats the target's
next-token prediction. A proposal needs no model forward: H small matrix products and the LM head.

Two shapes of proposal, both verified exactly:

- **chain** (``tree: null``): the first k heads each propose one token, drawn from their draft
  distribution q_i (argmax when greedy) and verified by :func:`specdec.verify.rejection_sample`. The
  drafts are drawn independently of each other, which the rejection rule allows: it only needs each draft
  to come from the q_i it reports.
- **tree** (the default): candidates are the top-r tokens of each head, combined along *paths*: the path
  [r_0, r_1, ..] is rank r_0 of head 0, then rank r_1 of head 1, and so on. Paths are listed in priority
  order (parents first) and k takes the first k of them, so one number sizes the tree. Candidates are
  deterministic (one-hot q) and verified by :func:`specdec.verify_tree.verify_tree`.
- **dynamic tree** (``min_confidence > 0``): of those k paths, each step keeps the ones whose confidence
  (the product of the heads' probabilities along the path, EAGLE-2's estimate of its acceptance),
  averaged over the batch's rows, reaches ``min_confidence``; a step where none does is a plain decode
  step. Where verifying a token costs a good fraction of a decode step (a CPU), unlikely nodes cost more
  than they return. The tree's shape
  depends on the context only, never on the target's draws, so verification stays exact. A chain is cut
  the same way, before the first position whose confidence (the drafts before it, then its head's best
  probability) falls short — never by looking at the draft being decided on, which would bias the token
  emitted in its place.

**Token-aware heads** (``MedusaHeads(token_aware=True)``, ``train_medusa token_aware=true``; the
sequentially dependent heads of Hydra, Ankner et al. 2024): head i also reads the embeddings of the token
the target just emitted and of the i draft tokens on the path before its own, [h; E(x_t+1); ...; E(x_t+1+i)],
through the residual block's linear layer. A tree is then drafted level by level (a node's candidates are
the top tokens of its depth's head given the node's path: one small head call per level instead of one in
all) and a chain head by head, each draft drawn from the q it reports given the drafts before it. The
target's input embeddings come with the drafter (``embed_weight``).

**Prompt-lookup branch** (``lookup`` L > 0, trees only): each step also looks up the n-gram drafter's
continuation of the text so far (:func:`specdec.drafters.ngram.lookup`, up to L tokens) and adds it to the
tree; the Medusa tree gets the first k − L paths, so a proposal never exceeds k nodes. With one row the
continuation is merged in like a trie (down the Medusa nodes that already hold its tokens, the rest as a
new chain below; no two siblings share a token). With several rows, whose continuations differ while the
engine verifies one tree shape for all, it hangs below the root as its own chain, tried first (a row with
a shorter or no continuation fills it with its last token). Lookup nodes are deterministic like the
Medusa ones, so verification stays exact. Text that repeats (code, quoted input) is where the heads are
weakest and the lookup strongest.

``dtype`` (e.g. bfloat16; ``"auto"``, the config's default, picks bfloat16 for a float32 target where it
is fast: a GPU, or a CPU with avx512_bf16 or AMX) runs the heads, the draft LM-head rows and the embeddings
they read in that dtype; the target, and so verification, keeps its own. Drafts may change, exactness
does not: the q a chain draft is drawn from is computed in float32 from the heads' logits and reported as
drawn.

``acceptance="typical"`` (``drafter.acceptance=typical``) swaps the exact rule for Medusa's own default,
typical acceptance (:mod:`specdec.verify_typical`): LOSSY at temperature > 0, never the default, offered to
measure what it costs; the drafter then reports ``lossy`` and results carry it.

Heads are stored as safetensors with their shape and target in the metadata (:func:`save_heads`), and a
``tree`` (priority-ordered paths measured on held-out data by :mod:`specdec.train_medusa`).
"""

from __future__ import annotations

import copy
import json
import logging
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from specdec.config import DrafterConfig
from specdec.drafters.base import DecodeState, Drafter, Proposal, register
from specdec.drafters.ngram import NgramDrafter, lookup
from specdec.errors import CheckpointError
from specdec.io import read_metadata, read_tensors
from specdec.loading import resolve_dtype
from specdec.sampling import logits_to_probs, sample
from specdec.verify.lossy.typical import TypicalAcceptance
from specdec.verify.tree import Tree

log = logging.getLogger(__name__)

FORMAT = "specdec-medusa-1"
DEFAULT_HEADS = "default"  # the heads shipped for the default target, SmolLM2-135M-Instruct
_MAX_TREES = 1024  # tree shapes cached per drafter (a lookup branch merged in makes many)


def default_heads_path() -> Path:
    return Path(str(resources.files("specdec") / "assets" / "medusa" / "smollm2-135m" / "heads.safetensors"))


class ResBlock(nn.Module):
    """h + SiLU(W x + b), x = h, or for a token-aware head [h; embeddings of the ``known`` tokens before]."""

    def __init__(self, hidden_size: int, known: int = 0):
        super().__init__()
        self.known = known
        self.linear = nn.Linear(hidden_size * (1 + known), hidden_size)
        nn.init.zeros_(self.linear.weight)  # a fresh head is the identity, i.e. the base next-token head
        nn.init.zeros_(self.linear.bias)

    def forward(self, h: torch.Tensor, known: torch.Tensor | None = None) -> torch.Tensor:  # [..., H] -> [..., H]
        x = h if not self.known else torch.cat([h, known[..., : self.known, :].flatten(-2)], -1)  # known [..., n, H]
        return h + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """``num_heads`` residual blocks, then the shared LM head (passed at call time) or an own one each.

    ``token_ids`` (optional, [V'] long): a *draft vocabulary* — the heads score only these tokens (the
    rows of the LM head they select), e.g. the V' most frequent tokens in the target's answers, as in
    FR-Spec (Zhao et al. 2025). Drafting and training then cost V'/V of the full LM head; a token outside
    the draft vocabulary can never be proposed, which costs acceptance only where the target emits a rare
    token. Verification is unchanged and stays exact: the target still scores its full vocabulary.
    """

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, own_lm_head: bool = False,
                 token_ids: torch.Tensor | None = None, token_aware: bool = False):
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {num_heads}")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        if token_ids is not None:
            token_ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
            if not 0 < token_ids.numel() < vocab_size or int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab_size \
                    or token_ids.unique().numel() != token_ids.numel():
                raise ValueError(f"token_ids must be fewer than {vocab_size} distinct token ids in [0, {vocab_size}) "
                                 f"(None = the full vocabulary), got {token_ids.numel()} "
                                 f"ids in [{int(token_ids.min()) if token_ids.numel() else '-'}, "
                                 f"{int(token_ids.max()) if token_ids.numel() else '-'}]")
            self.register_buffer("token_ids", token_ids)
        else:
            self.token_ids = None
        self.draft_vocab_size = vocab_size if token_ids is None else token_ids.numel()
        self.token_aware = token_aware
        self.blocks = nn.ModuleList(ResBlock(hidden_size, i + 1 if token_aware else 0) for i in range(num_heads))
        self.lm_heads = nn.ModuleList(nn.Linear(hidden_size, self.draft_vocab_size, bias=False)
                                      for _ in range(num_heads)) if own_lm_head else None

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def draft_lm_head(self, lm_head_weight: torch.Tensor) -> torch.Tensor:  # [V, H] -> [V', H]
        """The rows of the target's LM head that score the draft vocabulary (all of it without one)."""
        return lm_head_weight if self.token_ids is None else lm_head_weight[self.token_ids].contiguous()

    def to_token_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Indices into the draft vocabulary -> the target's token ids."""
        return index if self.token_ids is None else self.token_ids[index]

    def init_lm_heads(self, lm_head_weight: torch.Tensor) -> None:  # [V, H]
        """Start every own LM head as a copy of the target's (its draft-vocabulary rows)."""
        if self.lm_heads is not None:
            for head in self.lm_heads:
                head.weight.data.copy_(self.draft_lm_head(lm_head_weight))

    def forward(
        self,
        hidden: torch.Tensor,  # [..., H] target final hidden states
        lm_head_weight: torch.Tensor,  # [V, H] the target's (frozen) LM head, or its draft_lm_head() rows [V', H]
        num_heads: int | None = None,  # use the first heads only
        known: torch.Tensor | None = None,  # token-aware heads: [..., >= h, H] embeddings of the tokens before
        first: int = 0,  # start at this head (token-aware drafting evaluates one head at a time)
    ) -> torch.Tensor:  # [..., num_heads, V'] logits over the draft vocabulary (V' = V without one)
        """Each head's logits. A token-aware head i also reads ``known[..., :i+1]``: the embeddings of the
        token the target just emitted and of the i tokens after it (teacher-forced in training, the draft
        path when drafting)."""
        if self.token_aware and known is None:
            raise ValueError("token-aware Medusa heads need the embeddings of the known tokens (known=...)")
        blocks = self.blocks[first: num_heads or self.num_heads]
        z = torch.stack([block(hidden, known) for block in blocks], -2)  # [..., h, H]
        if self.lm_heads is not None:
            return torch.stack([head(z[..., i, :]) for i, head in enumerate(self.lm_heads[first: first + len(blocks)])], -2)
        if self.token_ids is not None and lm_head_weight.shape[0] == self.vocab_size:
            lm_head_weight = self.draft_lm_head(lm_head_weight)  # callers in a loop pass the rows, sliced once
        flat = z.reshape(-1, z.shape[-1])  # [R, H]
        # W·zᵀ rather than z·Wᵀ: the same product, several times faster on CPU for a few rows.
        return torch.mm(lm_head_weight, flat.t()).t().reshape(*z.shape[:-1], -1)


def save_heads(path: str | Path, heads: MedusaHeads, *, target: str = "", tree: list[list[int]] | None = None,
               extra: dict[str, Any] | None = None, dtype: torch.dtype | None = None) -> None:
    """Write ``heads`` as safetensors (atomically: a temporary file, then a rename); ``dtype`` (e.g.
    torch.float16, half the file) stores the weights in it. Loading casts them to the heads' dtype."""
    path = Path(path)
    meta = {"format": FORMAT, "hidden_size": heads.hidden_size, "vocab_size": heads.vocab_size,
            "draft_vocab_size": heads.draft_vocab_size, "num_heads": heads.num_heads,
            "own_lm_head": heads.lm_heads is not None, "token_aware": heads.token_aware, "target": target,
            "tree": tree, **(extra or {})}
    tensors = {name: t.detach().cpu().to(dtype if dtype and t.is_floating_point() else t.dtype).contiguous()
               for name, t in heads.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata={"specdec": json.dumps(meta)})
    tmp.replace(path)


def load_heads(path: str | Path, *, hidden_size: int, vocab_size: int) -> tuple[MedusaHeads, dict[str, Any]]:
    """Load heads saved by :func:`save_heads` for a target of ``hidden_size`` and ``vocab_size``.

    Raises :class:`~specdec.errors.CheckpointError` (a ValueError) naming the file when it is not a heads
    file specdec wrote, is corrupt, or was trained for a target of another shape.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "heads.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"no Medusa heads at {str(path)!r}; train some with `python -m specdec.train_medusa` "
                                f"or use drafter.heads={DEFAULT_HEADS} for the default target's")
    hint = (f"point drafter.heads at a file written by `python -m specdec.train_medusa` (or its export "
            f"directory), or use drafter.heads={DEFAULT_HEADS} for the default target's")
    meta = json.loads(read_metadata(path, what="Medusa heads file", hint=hint).get("specdec", "{}"))
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{str(path)!r} is not a specdec Medusa heads file (format {meta.get('format')!r}, "
                              f"expected {FORMAT!r}); {hint}")
    if (meta["hidden_size"], meta["vocab_size"]) != (hidden_size, vocab_size):
        raise CheckpointError(
            f"Medusa heads {str(path)!r} were trained for a target with hidden size {meta['hidden_size']} and "
            f"vocabulary {meta['vocab_size']} (target {meta.get('target') or 'unknown'!r}), but this target has "
            f"hidden size {hidden_size} and vocabulary {vocab_size}; train heads for it with "
            f"`python -m specdec.train_medusa target=<this target>`"
        )
    tensors = read_tensors(path, what="Medusa heads file", hint=hint)
    heads = MedusaHeads(hidden_size, vocab_size, meta["num_heads"], own_lm_head=meta["own_lm_head"],
                        token_ids=tensors.get("token_ids"), token_aware=meta.get("token_aware", False))
    heads.load_state_dict(tensors)
    return heads.eval().requires_grad_(False), meta


def check_paths(paths: Any, num_heads: int) -> list[list[int]]:
    """Validate a tree given as priority-ordered paths of head ranks; return it as plain lists."""
    paths = [[int(r) for r in p] for p in paths]
    seen: set[tuple[int, ...]] = set()
    for p in paths:
        if not p or len(p) > num_heads or min(p) < 0:
            raise ValueError(f"tree path {p} must list 1..{num_heads} non-negative ranks (one per Medusa head)")
        if tuple(p) in seen or (len(p) > 1 and tuple(p[:-1]) not in seen):
            raise ValueError(f"tree path {p} is repeated or listed before its parent {p[:-1]}")
        seen.add(tuple(p))
    return paths


def fast_bf16(device: torch.device) -> bool:
    """Whether bfloat16 matrix products are fast here: a GPU, or a CPU with avx512_bf16 or AMX."""
    if device.type != "cpu":
        return True
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private in torch.cpu; absent = unknown
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


def drafting_dtype(dtype: torch.dtype | str | None, lm_head_weight: torch.Tensor) -> torch.dtype:
    """The heads' dtype for ``dtype``: None = the target's (its LM head's); "auto" = bfloat16 for a float32
    target where :func:`fast_bf16`, else the target's; otherwise the dtype named."""
    if dtype is None:
        return lm_head_weight.dtype
    if dtype == "auto":
        fast = lm_head_weight.dtype == torch.float32 and fast_bf16(lm_head_weight.device)
        return torch.bfloat16 if fast else lm_head_weight.dtype
    return resolve_dtype(dtype)


@dataclass(frozen=True)
class _TreePlan:
    tree: Tree
    head: torch.Tensor  # [N] long: which head proposes each node (its depth - 1)
    rank: torch.Tensor  # [N] long: which of that head's top tokens it is
    top: int  # ranks needed per head
    levels: list[_Level]  # the nodes depth by depth (token-aware drafting)


@dataclass(frozen=True)
class _Level:
    nodes: torch.Tensor  # [n] the nodes at this depth
    above: torch.Tensor  # [P] their distinct parents, as positions in the level above (the root: [0])
    slot: torch.Tensor  # [n] each node's parent, as a position in ``above``
    rank: torch.Tensor  # [n] each node's rank among its parent's candidates
    top: int  # candidates needed per parent


def _plan(paths: list[list[int]], device: torch.device) -> _TreePlan:
    index = {tuple(p): i for i, p in enumerate(paths)}
    parents = [index[tuple(p[:-1])] if len(p) > 1 else -1 for p in paths]
    levels, previous = [], [-1]  # the root is the level above depth 1
    for depth in range(1, max(len(p) for p in paths) + 1):
        nodes = [i for i, p in enumerate(paths) if len(p) == depth]
        above = sorted({parents[i] for i in nodes}, key=previous.index)
        levels.append(_Level(*(torch.tensor(x, device=device) for x in (
            nodes, [previous.index(a) for a in above], [above.index(parents[i]) for i in nodes],
            [paths[i][-1] for i in nodes])), 1 + max(paths[i][-1] for i in nodes)))
        previous = nodes
    return _TreePlan(Tree.from_parents(parents, device), torch.tensor([len(p) - 1 for p in paths], device=device),
                     torch.tensor([p[-1] for p in paths], device=device), 1 + max(p[-1] for p in paths), levels)


def _confident(path_logp: torch.Tensor, min_confidence: float) -> torch.Tensor:  # path_logp [B, N] -> [N] bool
    """Which nodes a dynamic tree keeps: those whose confidence (path probability), averaged over the rows,
    reaches the threshold. One tree serves the whole batch and every kept node is verified in every row,
    so a node pays when the tokens it is expected to add across the rows reach ``min_confidence`` per row
    it costs; at batch 1 this is the node's own confidence. (Keeping a node confident in *any* row made the
    batch-4 tree ~4x wider.) A path's mean is never above its parent's, so pruning by parents is exact."""
    return path_logp.exp().mean(0) >= min_confidence


@register("medusa")
class MedusaDrafter(Drafter):
    """``heads`` on the target's LM head ``lm_head_weight``; ``paths`` = a tree (see the module docstring),
    None = chain drafting with the first k heads."""

    @dataclass
    class Config(DrafterConfig):
        name: str = "medusa"
        k: int = 23  # draft tokens per target forward at most: tree nodes (lookup's included), or chain heads
        heads: str = DEFAULT_HEADS  # "default" (shipped for SmolLM2-135M-Instruct) or a heads.safetensors path
        tree: Any = "default"  # "default" = the tree stored with the heads; null = chain; or a list of paths
        # Dynamic tree (EAGLE-2's rule): of the first k paths, keep those whose confidence — the product of
        # the heads' probabilities along the path, an estimate of how often it is accepted — reaches this
        # value (on average over the rows of a batch); none reaching it = a plain decode step. 0 = the fixed
        # tree of k paths. 0.05 drops the paths the heads all but rule out (configs/drafter/medusa.yaml); on
        # a GPU use 0 and a larger k.
        min_confidence: float = 0.05
        # Prompt-lookup branch (trees only): up to this many of the k nodes hold the n-gram lookup's
        # continuation of the text (see the module docstring); the Medusa tree gets the first k - lookup
        # paths. 0 = none (needed for a chain, tree: null).
        lookup: int = 8
        # The heads' dtype: "auto" = bfloat16 where it is fast (a GPU, a CPU with avx512_bf16 or AMX) for a
        # float32 target, else the target's; null = the target's; or a dtype name. Verification keeps the
        # target's dtype, so it stays exact.
        dtype: Optional[str] = "auto"
        # How drafts are verified: "exact" (rejection sampling, the default) or "typical" — Medusa's typical
        # acceptance, LOSSY at temperature > 0 (specdec.verify_typical; results are marked lossy): a draft
        # token passes where the target gives it more than min(typical_epsilon, typical_alpha · exp(−H(p))).
        acceptance: str = "exact"
        typical_epsilon: float = 0.09
        typical_alpha: float = 0.3

    def __init__(self, heads: MedusaHeads, lm_head_weight: torch.Tensor, paths: list[list[int]] | None = None,
                 min_confidence: float = 0.0, embed_weight: torch.Tensor | None = None, lookup: int = 0,
                 dtype: torch.dtype | str | None = None, acceptance: str | TypicalAcceptance = "exact"):
        if acceptance == "typical":
            acceptance = TypicalAcceptance()
        elif acceptance == "exact":
            acceptance = None
        elif not isinstance(acceptance, TypicalAcceptance):
            raise ValueError(f"acceptance must be 'exact' or 'typical' (Medusa's typical acceptance, lossy), "
                             f"got {acceptance!r}; set drafter.acceptance")
        if not 0.0 <= min_confidence < 1.0:
            raise ValueError(f"min_confidence must be in [0, 1) (0 = a fixed tree), got {min_confidence}")
        if heads.token_aware and embed_weight is None:
            raise ValueError("token-aware Medusa heads need the target's input embeddings (embed_weight=...)")
        if isinstance(lookup, bool) or not isinstance(lookup, int) or lookup < 0:
            raise ValueError(f"lookup (prompt-lookup nodes per tree) must be an integer >= 0, got {lookup!r}")
        if lookup and paths is None:
            raise ValueError(f"lookup={lookup}: the prompt-lookup branch joins a tree, and chain drafting "
                             f"(tree: null) has none; give a tree or set lookup=0 (drafter.lookup=0)")
        self.dtype = drafting_dtype(dtype, lm_head_weight)
        if next(heads.parameters()).dtype != self.dtype:
            heads = copy.deepcopy(heads).to(self.dtype)  # the caller's heads stay as they are
        self.heads = heads
        self.embed_weight = embed_weight  # [V, H] the target's input embeddings (token-aware heads only)
        self.lm_head_weight = heads.draft_lm_head(lm_head_weight).to(self.dtype)  # [V', H]: the draft vocabulary's rows
        self.paths = None if paths is None else check_paths(paths, heads.num_heads)
        self.min_confidence = min_confidence
        self.lookup = lookup
        self.acceptance = acceptance
        self._plans: dict[tuple[int, ...], _TreePlan] = {}
        self._trees: dict[tuple[int, ...], Tree] = {}
        self.forwards = 0

    @classmethod
    def from_config(cls, cfg, target=None, tokenizer=None) -> "MedusaDrafter":
        from specdec.models import as_decoder

        if cfg.lookup and cfg.lookup >= cfg.k:
            raise ValueError(f"drafter.lookup={cfg.lookup} prompt-lookup nodes leave none of drafter.k={cfg.k} for "
                             f"the Medusa tree; raise drafter.k or lower drafter.lookup")
        decoder = as_decoder(target)
        lm_head = decoder.lm_head if hasattr(decoder, "lm_head") else decoder.model.get_output_embeddings()
        path = default_heads_path() if cfg.heads in (None, "", DEFAULT_HEADS) else Path(cfg.heads).expanduser()
        vocab_size, hidden_size = lm_head.weight.shape
        heads, meta = load_heads(path, hidden_size=hidden_size, vocab_size=vocab_size)
        heads.to(device=lm_head.weight.device)  # the drafter casts them to its dtype
        if cfg.tree == "default":
            paths = meta.get("tree")
            if not paths:
                raise ValueError(f"{str(path)!r} stores no tree; give drafter.tree=[[0],[1],[0,0],...] or null (chain)")
        else:
            paths = cfg.tree
        embed = None
        if heads.token_aware:
            model = getattr(decoder, "model", target)
            embed = (decoder.embed_tokens if hasattr(decoder, "embed_tokens") else model.get_input_embeddings()).weight
        acceptance = (TypicalAcceptance(cfg.typical_epsilon, cfg.typical_alpha) if cfg.acceptance == "typical"
                      else cfg.acceptance)  # "exact", or a wrong name the drafter reports
        drafter = cls(heads, lm_head.weight, None if paths is None else list(paths), cfg.min_confidence, embed,
                      lookup=cfg.lookup, dtype=cfg.dtype, acceptance=acceptance)
        if drafter.lossy:
            log.warning("drafter.acceptance=typical: Medusa's typical acceptance is LOSSY at temperature > 0 "
                        "(output not distributed as the target's); results are marked lossy")
        log.info("Medusa heads %s drafting in %s (drafter.dtype=%s)", path, drafter.dtype, cfg.dtype)
        return drafter

    def start(self, state: DecodeState) -> None:
        if (state.last_hidden.shape[-1], state.vocab_size) != (self.heads.hidden_size, self.heads.vocab_size):
            raise ValueError(
                f"Medusa heads expect hidden size {self.heads.hidden_size} and vocabulary {self.heads.vocab_size}, "
                f"the target has {state.last_hidden.shape[-1]} and {state.vocab_size}; train heads for this target"
            )

    def _tree_plan(self, nodes: tuple[int, ...], device: torch.device) -> _TreePlan:
        """The plan of the tree made of these paths (indices into ``self.paths``, parents included)."""
        if nodes not in self._plans:
            self._plans[nodes] = _plan([self.paths[i] for i in nodes], device)
        return self._plans[nodes]

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:  # [...] -> [..., H] in the heads' dtype
        return self.embed_weight[tokens].to(self.dtype)

    def _confident_prefix(self, logits: torch.Tensor, index: torch.Tensor) -> int:  # [B, k, V'], [B, k]
        """How many chain drafts to keep: the longest prefix (in any row) over which the confidence of
        position i — P(drafts before i) · max q_i, the heads' probabilities — reaches ``min_confidence``.
        Whether draft i is kept never depends on draft i itself: dropping a draft *because of its value*
        would bias the token emitted in its place; a stop after it is a plain bonus position."""
        logp = logits.log_softmax(-1)  # [B, k, V']
        drafted = logp.gather(-1, index[..., None])[..., 0]  # [B, k]
        confidence = drafted.cumsum(-1) - drafted + logp.amax(-1)  # [B, k]: drafts before i, then q_i's best
        keep = (confidence >= math.log(self.min_confidence)).long().cumprod(-1)  # [B, k]: a prefix per row
        return int(keep.sum(-1).max())

    def _chain_token_aware(self, state: DecodeState, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
        """Chain drafts one head at a time, each head reading the drafts before it: draft i is drawn from
        q_i( · | the emitted token, drafts 0..i-1), the q_i that is reported — what rejection sampling needs."""
        params = state.sampling
        known = self._embed(state.last_tokens)[:, None]  # [B, 1, H]
        logits, qs, index = [], [], []
        for i in range(k):
            logit = self.heads(hidden, self.lm_head_weight, num_heads=i + 1, known=known, first=i)[:, 0].float()
            q = logits_to_probs(logit, params.temperature, params.top_k, params.top_p)  # [B, V']
            draw = sample(q, state.generator)  # [B]
            logits.append(logit), qs.append(q), index.append(draw)
            known = torch.cat([known, self._embed(self.heads.to_token_ids(draw))[:, None]], 1)
        return torch.stack(logits, 1), torch.stack(qs, 1), torch.stack(index, 1)

    def _tree_token_aware(self, state: DecodeState, hidden: torch.Tensor, plan: _TreePlan,
                          min_confidence: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Tree drafts level by level: a node's candidates are the top tokens of the head at its depth given
        the emitted token and the tokens on the node's path. Returns tokens and *path* log-probabilities
        [B, N] (the heads' log-probabilities summed along each node's path).

        With ``min_confidence`` (dynamic trees), only nodes whose parent passes :func:`_confident` are drafted; the
        others get -inf. A path is never likelier than its parent, so exactly the
        nodes that could pass the same test are drafted, and an unpromising step costs one head call."""
        batch, n = state.last_tokens.shape[0], plan.head.numel()
        tokens = state.last_tokens.new_zeros(batch, n)
        path_logp = hidden.new_full((batch, n), -math.inf, dtype=torch.float32)
        known = self._embed(state.last_tokens)[:, None, None]  # [B, 1, 1, H]: the root's path
        above_logp = path_logp.new_zeros(batch, 1)  # [B, 1]: the root's
        for depth, level in enumerate(plan.levels):
            above, slot, rank, nodes = level.above, level.slot, level.rank, level.nodes
            if min_confidence is not None and depth:
                open_ = _confident(above_logp[:, above], min_confidence)  # [P]: parents worth expanding
                if not bool(open_.any()):
                    break
                if not bool(open_.all()):
                    keep = open_[slot]  # [n]: nodes under an open parent
                    above, slot = above[open_], (open_.cumsum(0) - 1)[slot[keep]]
                    rank, nodes = rank[keep], nodes[keep]
            parents = known[:, above]  # [B, P, depth+1, H]: the paths of the parents drafted from
            expanded = hidden[:, None].expand(-1, parents.shape[1], -1)  # [B, P, H]
            logits = self.heads(expanded, self.lm_head_weight, num_heads=depth + 1, known=parents,
                                first=depth)[:, :, 0].float()
            top = logits.topk(level.top if rank is level.rank else 1 + int(rank.max()), dim=-1)  # [B, P, r]
            drafted = self.heads.to_token_ids(top.indices[:, slot, rank])  # [B, n']
            tokens[:, nodes] = drafted
            own = (top.values - logits.logsumexp(-1, keepdim=True))[:, slot, rank].clamp(max=0)
            level_logp = above_logp[:, above][:, slot] + own  # [B, n']
            path_logp[:, nodes] = level_logp
            known = torch.cat([parents[:, slot], self._embed(drafted)[:, :, None]], 2)  # [B, n', depth+2, H]
            above_logp = level_logp
            if nodes is not level.nodes:  # the next level finds its parents by position in the whole level
                where = torch.searchsorted(level.nodes, nodes)  # undrafted nodes: never open, never read
                known = known.new_zeros(batch, level.nodes.numel(), *known.shape[2:]).index_copy_(1, where, known)
                above_logp = level_logp.new_full((batch, level.nodes.numel()), -math.inf).index_copy_(1, where, level_logp)
        return tokens, path_logp

    @torch.no_grad()
    def propose(self, state: DecodeState, k: int) -> Proposal:
        params = state.sampling
        batch = state.last_tokens.shape[0]
        hidden = state.last_hidden.to(self.dtype)  # [B, H]
        self.forwards += 1
        if self.paths is None:
            if k > self.heads.num_heads:
                raise ValueError(f"chain drafting proposes one token per Medusa head: k={k} exceeds the "
                                 f"{self.heads.num_heads} heads; lower k")
            if self.heads.token_aware:
                logits, q, index = self._chain_token_aware(state, hidden, k)
            else:
                logits = self.heads(hidden, self.lm_head_weight, num_heads=k).float()  # [B, k, V']
                q = logits_to_probs(logits, params.temperature, params.top_k, params.top_p)  # [B, k, V']
                index = sample(q, state.generator)  # [B, k]
            if self.min_confidence > 0:
                k = self._confident_prefix(logits, index)
                if k == 0:
                    return Proposal(tokens=index[:, :0], num_proposed=[0] * batch)
                index, q = index[:, :k], q[:, :k]
            tokens = self.heads.to_token_ids(index)  # [B, k]
            if not params.greedy and self.heads.token_ids is not None:  # q over the full vocabulary, 0 elsewhere
                q = q.new_zeros(*q.shape[:-1], state.vocab_size).index_copy_(-1, self.heads.token_ids, q)
            return Proposal(tokens=tokens, probs=None if params.greedy else q, num_proposed=[k] * batch)
        if k <= self.lookup:
            raise ValueError(f"k={k} tree nodes, {self.lookup} of them for the prompt-lookup branch, leave none for "
                             f"the Medusa tree; raise k or lower lookup")
        if k - self.lookup > len(self.paths):
            raise ValueError(f"k={k} tree nodes requested ({self.lookup} for the prompt-lookup branch), but the tree "
                             f"lists only {len(self.paths)} paths; lower k or give a larger drafter.tree")
        tokens, tree = self._medusa_tree(state, hidden, k - self.lookup)
        filler = [0] * batch
        if self.lookup:
            tokens, tree, filler = self._add_lookup(state, tokens, tree)
        if tree is None:  # no path is worth its verification, no continuation found: a plain step
            return Proposal(tokens=tokens[:, :0], num_proposed=[0] * batch)
        return Proposal(tokens=tokens, num_proposed=[tokens.shape[1] - f for f in filler], tree=tree)

    def _medusa_tree(self, state: DecodeState, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, Tree | None]:
        """The heads' tree of the first k paths (dynamic: those confident enough): tokens [B, N], its shape
        (None when no path is kept)."""
        plan = self._tree_plan(tuple(range(k)), state.last_tokens.device)
        min_confidence = self.min_confidence if self.min_confidence > 0 else None
        path_logp = None
        if self.heads.token_aware:
            tokens, path_logp = self._tree_token_aware(state, hidden, plan, min_confidence)
        else:
            logits = self.heads(hidden, self.lm_head_weight, num_heads=plan.tree.max_depth).float()  # [B, D, V']
            top = logits.topk(plan.top, dim=-1)  # [B, D, r]: each head's candidates, best first
            tokens = self.heads.to_token_ids(top.indices)[:, plan.head, plan.rank]  # [B, N]
            if self.min_confidence > 0:
                node_logp = (top.values - logits.logsumexp(-1, keepdim=True))[:, plan.head, plan.rank]  # [B, N]
        if min_confidence is not None:
            if path_logp is None:
                ancestry = plan.tree.mask[1:, 1:].to(node_logp.dtype)  # [N, N]: node n's path (itself, ancestors)
                path_logp = node_logp.clamp(max=0) @ ancestry.t()  # [B, N]
            confident = _confident(path_logp, min_confidence)  # [N], parents first
            nodes = tuple(confident.nonzero().flatten().tolist())
            if not nodes:
                return tokens[:, :0], None
            plan = self._tree_plan(nodes, state.last_tokens.device)
            tokens = tokens[:, list(nodes)]
        return tokens, plan.tree

    def _add_lookup(self, state: DecodeState, tokens: torch.Tensor,
                    tree: Tree | None) -> tuple[torch.Tensor, Tree | None, list[int]]:
        """Add each row's prompt-lookup continuation to the Medusa tree (tokens [B, N]); see the module
        docstring. Returns the new tokens [B, N'] (N' <= N + lookup), tree, and each row's filler nodes."""
        ngram = NgramDrafter.Config
        found = [lookup(np.asarray(row, dtype=np.int64), self.lookup, ngram.max_ngram, ngram.min_ngram).tolist()
                 if on else [] for row, on in zip(state.tokens, state.active)]
        width = max(len(chain) for chain in found)
        if width == 0:
            return tokens, tree, [0] * len(found)
        parents = [] if tree is None else list(tree.parent_list)
        if len(found) == 1:  # merge like a trie: follow nodes that hold the continuation's tokens
            row = tokens[0].tolist()
            children: dict[int, dict[int, int]] = {}
            for i, parent in enumerate(parents):
                children.setdefault(parent, {}).setdefault(row[i], i)
            node = -1
            for token in found[0]:
                below = children.setdefault(node, {}).get(token)
                if below is None:
                    row.append(token), parents.append(node)
                    below = children[node][token] = len(row) - 1
                node = below
            tokens = torch.tensor([row], dtype=tokens.dtype, device=tokens.device)
        else:  # the continuations first, as a chain below the root, then the Medusa tree
            chains = [chain + [state.tokens[b][-1]] * (width - len(chain)) for b, chain in enumerate(found)]
            tokens = torch.cat([torch.tensor(chains, dtype=tokens.dtype, device=tokens.device), tokens], 1)
            parents = list(range(-1, width - 1)) + [p + width if p >= 0 else -1 for p in parents]
        filler = [0] if len(found) == 1 else [width - len(chain) for chain in found]
        return tokens, self._tree(tuple(parents), tokens.device), filler

    def _tree(self, parents: tuple[int, ...], device: torch.device) -> Tree:
        if parents not in self._trees:
            if len(self._trees) >= _MAX_TREES:
                self._trees.clear()
            self._trees[parents] = Tree.from_parents(list(parents), device)
        return self._trees[parents]
