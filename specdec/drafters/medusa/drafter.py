"""The Medusa drafter: heads (:mod:`specdec.drafters.medusa.heads`) drafting a chain or a tree each step.

Two shapes of proposal, each a small strategy class, both verified exactly:

- **chain** (``tree: null``, :class:`~specdec.drafters.trees.drafting.ChainDrafting`): the first k heads each
  propose one token, drawn from their draft distribution q_i (argmax when greedy) and verified by
  :func:`specdec.verify.rejection_sample`.
- **tree** (the default, :class:`~specdec.drafters.trees.drafting.TreeDrafting`): candidates are the top-r tokens
  of each head, combined along *paths*: the path [r_0, r_1, ..] is rank r_0 of head 0, then rank r_1 of head 1,
  and so on (:mod:`specdec.drafters.trees.plan`). Paths are listed in priority order (parents first) and k takes the
  first k of them, so one number sizes the tree. Candidates are deterministic (one-hot q) and verified by
  :func:`specdec.verify.tree.verify_tree`.
- **dynamic** (``min_confidence > 0``): of those k paths, each step keeps the ones whose confidence (the
  product of the heads' probabilities along the path), averaged over the batch's rows, reaches
  ``min_confidence``; a chain is cut before the first position not confident enough. None kept = a plain
  decode step. EAGLE-2's rule; :mod:`specdec.drafters.trees.dynamic` says why it stays exact. The config's
  default (``null``) is dynamic on a CPU and fixed on a GPU (:data:`GPU_MIN_CONFIDENCE`).

Token-aware heads draft a chain head by head and a tree level by level
(:mod:`specdec.drafters.medusa.candidates`); the target's input embeddings come with the drafter
(``embed_weight``).

**Prompt-lookup branch** (``lookup`` L > 0, trees only): each step also looks up the n-gram drafter's
continuation of the text so far (up to L tokens) and adds it to the tree
(:mod:`specdec.drafters.trees.lookup_branch`); the Medusa tree gets the first k − L paths, so a proposal
never exceeds k nodes. On a GPU (``lookup_on_device``, by default where the heads are on CUDA) the lookup runs on the
device as a fixed chain of L nodes, so a fixed tree with it is drafted on the device alone and read a step late.

``dtype`` (e.g. bfloat16; ``"auto"``, the config's default, picks bfloat16 for a float32 target where it
is fast: a GPU, or a CPU with avx512_bf16 or AMX) runs the heads, the draft LM-head rows and the embeddings
they read in that dtype; the target, and so verification, keeps its own. Drafts may change, exactness
does not: the q a chain draft is drawn from is computed in float32 from the heads' logits and reported as
drawn.

``acceptance="typical"`` (``drafter.acceptance=typical``) swaps the exact rule for Medusa's own default,
typical acceptance (:mod:`specdec.verify.lossy.typical`): LOSSY at temperature > 0, never the default, offered to
measure what it costs; the drafter's ``traits.lossy`` then says so and results carry it.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch

from specdec.config import DrafterConfig
from specdec.drafters.base import DecodeState, Drafter, DraftRuntime, Proposal, Traits, register
from specdec.drafters.loading import PATH_ALIAS, weights_path
from specdec.drafters.medusa.candidates import TokenAwareHeads
from specdec.drafters.medusa.heads import DEFAULT_HEADS, MedusaHeads, default_heads_path, load_heads
from specdec.drafters.trees.drafting import ChainDrafting, IndependentHeads, TreeDrafting
from specdec.drafters.trees.plan import check_paths
from specdec.models.backend import Backend
from specdec.models.graphs import Graphs
from specdec.models.loading import resolve_dtype
from specdec.verify.lossy.typical import TypicalAcceptance

log = logging.getLogger(__name__)
# drafter.min_confidence=null: a dynamic tree on a CPU, where each verified token costs time (0.4 keeps the paths
# worth it there: configs/drafter/medusa.yaml); the fixed tree on a GPU, where one H200 ran it at 881-928 tok/s
# against the dynamic tree's 493 and plain decoding's 787 (experiments/README.md#h200-device-drafters-2026-11-27)
CPU_MIN_CONFIDENCE, GPU_MIN_CONFIDENCE = 0.4, 0.0


def default_min_confidence(device: torch.device) -> float:
    """``drafter.min_confidence=null`` where the heads run on ``device``: the fixed tree on a GPU, else dynamic."""
    return GPU_MIN_CONFIDENCE if device.type == "cuda" else CPU_MIN_CONFIDENCE


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


@register("medusa")
class MedusaDrafter(Drafter):
    """``heads`` on the target's LM head ``lm_head_weight``; ``paths`` = a tree (see the module docstring),
    None = chain drafting with the first k heads; the heads' CPU products on ``backend`` (set on them)."""

    @dataclass
    class Config(DrafterConfig):
        name: str = "medusa"
        # draft tokens per target forward at most: tree nodes (lookup's included), or chain heads; "auto": specdec.run
        k: Union[int, str] = 23
        # Where the heads are: "default" (shipped for SmolLM2-135M-Instruct), or what `python -m specdec.train
        # method=medusa` wrote (its output or export directory, or the heads.safetensors in it)
        path: str = DEFAULT_HEADS
        heads: Optional[str] = PATH_ALIAS  # the old name of path: still works, with a note to use path
        tree: Any = "default"  # "default" = the tree stored with the heads; null = chain; or a list of paths
        # Dynamic tree (EAGLE-2's rule): of the first k paths, keep those whose confidence — the product of
        # the heads' probabilities along the path, an estimate of how often it is accepted — reaches this
        # value (on average over the rows of a batch); none reaching it = a plain decode step. 0 = the fixed
        # tree of k paths. null = where the heads run: 0.4 on a CPU (the paths worth a verified token's cost there),
        # 0 on a GPU (verifying the whole tree costs about a step; fixed, it is drafted on the device alone)
        min_confidence: Optional[float] = None
        # Prompt-lookup branch (trees only): up to this many of the k nodes hold the n-gram lookup's
        # continuation of the text (see the module docstring); the Medusa tree gets the first k - lookup
        # paths. 0 = none (needed for a chain, tree: null).
        lookup: int = 8
        # The heads' dtype: "auto" = bfloat16 where it is fast (a GPU, a CPU with avx512_bf16 or AMX) for a
        # float32 target, else the target's; null = the target's; or a dtype name. Verification keeps the
        # target's dtype, so it stays exact.
        dtype: Optional[str] = "auto"
        # How drafts are verified: "exact" (rejection sampling, the default) or "typical" — Medusa's typical
        # acceptance, LOSSY at temperature > 0 (specdec.verify.lossy.typical; results are marked lossy): a draft
        # token passes where the target gives it more than min(typical_epsilon, typical_alpha · exp(−H(p))).
        acceptance: str = "exact"
        typical_epsilon: float = 0.09
        typical_alpha: float = 0.3

    def __init__(self, heads: MedusaHeads, lm_head_weight: torch.Tensor, paths: list[list[int]] | None = None,
                 min_confidence: float = 0.0, embed_weight: torch.Tensor | None = None, lookup: int = 0,
                 dtype: torch.dtype | str | None = None, acceptance: str | TypicalAcceptance = "exact",
                 backend: Backend = Backend(), lookup_on_device: bool | None = None):
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
        heads.backend = backend
        self.embed_weight = embed_weight  # [V, H] the target's input embeddings (token-aware heads only)
        self.lm_head_weight = heads.draft_lm_head(lm_head_weight).to(self.dtype)  # [V', H]: the draft vocabulary's rows
        self.paths = None if paths is None else check_paths(paths, heads.num_heads)
        self.min_confidence = min_confidence
        self.lookup = lookup
        candidates = (TokenAwareHeads(heads, self.lm_head_weight, embed_weight) if heads.token_aware
                      else IndependentHeads(heads, self.lm_head_weight, backend))
        if lookup_on_device is None:  # a GPU finds the lookup branch on the device (lookup_branch's docstring)
            lookup_on_device = lm_head_weight.device.type == "cuda"
        self.drafting = (ChainDrafting(candidates, heads, min_confidence) if self.paths is None
                         else TreeDrafting(candidates, self.paths, min_confidence, lookup, lookup_on_device))
        # a tree drafts at its lookup nodes and at least one of its paths; a chain at one head per draft at most
        sizes = (range(1, heads.num_heads + 1) if self.paths is None
                 else range(lookup + 1, lookup + len(self.paths) + 1))
        # a fixed tree or chain is drafted on the device alone where its lookup branch is (a GPU's) or it has none
        self.traits = Traits(acceptance=acceptance, sizes=sizes,
                             device_only=min_confidence == 0 and (lookup == 0 or lookup_on_device))
        # a tree is drafted by replayed graphs of the heads' work (specdec.drafters.medusa.candidates): a fixed tree in
        # one graph, a dynamic one a graph per level; compiled or not, the same graphs (the heads are a few small
        # products). Chains (which sample inside) stay eager.
        self.runtime = DraftRuntime(backend, device=self._graph_device, route=self._use_graphs)

    @classmethod
    def from_config(cls, cfg, target=None, tokenizer=None, backend=Backend()) -> "MedusaDrafter":
        from specdec.models import as_decoder

        if cfg.lookup and cfg.lookup >= cfg.k:
            raise ValueError(f"drafter.lookup={cfg.lookup} prompt-lookup nodes leave none of drafter.k={cfg.k} for "
                             f"the Medusa tree; raise drafter.k or lower drafter.lookup")
        decoder = as_decoder(target)
        lm_head = decoder.lm_head if hasattr(decoder, "lm_head") else decoder.model.get_output_embeddings()
        location = weights_path(cfg, "heads", DEFAULT_HEADS)
        path = default_heads_path() if location in (None, "", DEFAULT_HEADS) else Path(location).expanduser()
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
        min_confidence = (default_min_confidence(lm_head.weight.device) if cfg.min_confidence is None
                          else cfg.min_confidence)
        drafter = cls(heads, lm_head.weight, None if paths is None else list(paths), min_confidence, embed,
                      lookup=cfg.lookup, dtype=cfg.dtype, acceptance=acceptance, backend=backend)
        if drafter.traits.lossy:
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

    def _graph_device(self) -> torch.device | None:
        return self.lm_head_weight.device if isinstance(self.drafting, TreeDrafting) else None

    def _use_graphs(self, graphs: Graphs, compile: bool) -> None:
        self.drafting.candidates.graphs = self.drafting.graphs = graphs  # the heads' tree, the device's lookup

    @torch.no_grad()
    def propose(self, state: DecodeState, k: int) -> Proposal:
        hidden = state.last_hidden.to(self.dtype)  # [B, H]
        self.runtime.forwards += 1
        return self.drafting.propose(state, hidden, k)

    def observe(self, state: DecodeState) -> None:
        """Nothing to roll back: the heads read only the target's newest hidden state."""
