"""The EAGLE drafter: the draft layer (:mod:`specdec.drafters.eagle.model`) drafting a chain or an EAGLE-2 tree.

Each step first *catches up*: the positions the target committed since the last step (``DecodeState.features``,
the target's feature layers there) enter the draft cache, each with the token that followed it, in one
forward; the output at the newest position gives the first draft distribution. Then:

- **chain** (``tree: false``): one draft per forward of the draft layer on its own output, k drafts in all;
  each drawn from its draft distribution q (argmax when greedy) and verified by the exact rule with that q.
- **tree** (``tree: true``, the default; EAGLE-2, Li et al. 2024): depth by depth, the ``expand`` most
  confident nodes of the depth (confidence: the product of the draft probabilities along the path) are run
  through the draft layer together, each giving ``top_k`` children; after ``depth`` levels the ``k`` most
  confident nodes form the tree the target verifies. In a batch the rows share one tree shape (nodes are
  named by their candidate ranks, as :mod:`specdec.drafters.trees.plan`'s paths, and ranked by confidence
  averaged over the rows, as :mod:`specdec.drafters.trees.dynamic` does); each row has its own tokens. The
  growth is :class:`~specdec.drafters.eagle.growth.TreeGrowth`.

Exactness at temperature > 0. The draft probabilities go through the target's temperature/top-k/top-p. A
chain draws each draft from q and reports q. A tree's children are either the ``top_k`` likeliest tokens
(``sampled: false``: fixed tokens, one-hot q, exact for any choice made from the drafter's own numbers, so
the final rerank is allowed) or ``top_k`` draws *without replacement* from q (``sampled: true``, the default
at temperature > 0), each reported with q renormalised over the tokens not drawn before it. A sampled node
must not be dropped because of its own value, so a sampled tree keeps every drawn node of the first depths
that fit in k (whole depths; which nodes get children may depend on their values: that only decides the
shape below them). Verification is multi-candidate recursive rejection sampling
(:mod:`specdec.verify.tree`).

Where graphs replay (a GPU; its runtime's :meth:`~specdec.drafters.base.DraftRuntime.replay_graphs`, which the main job
calls with ``target.compile``), the draft layer's forwards (a step's catch-up,
:func:`~specdec.drafters.base.replays_catch_up`; each chain or tree level) and its logits replay graphs
(:class:`~specdec.models.graphs.Graphs`): they attend over the draft cache's whole capacity (a cache kept across
generations, as the target's wrapper keeps its own) instead of a host-side length. A dynamic tree's choices between
levels (which nodes to expand) are read on the host; on a GPU a fixed tree (``min_confidence: 0``) of fixed candidates
(greedy, or ``sampled: false``) is grown and chosen on the device in ops of fixed shapes
(:class:`~specdec.drafters.eagle.growth.DeviceGrowth`: every level expands ``expand`` nodes, the ``k`` most confident
form the tree), one graph a step, nothing read back, so the decode loop reads it a step late.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import torch

from specdec.config import DrafterConfig
from specdec.drafters.base import (DecodeState, Drafter, DraftRuntime, Proposal, Traits, register, replays_catch_up,
                                  round_weights)
from specdec.drafters.eagle.growth import DeviceGrowth, TreeGrowth
from specdec.drafters.eagle.model import DEFAULT_EAGLE, EagleModel, default_eagle_path, load_eagle
from specdec.drafters.features import check_state, on_target
from specdec.drafters.trees.lookup_branch import add_branch, continuations
from specdec.drafters.trees.plan import TreeCache
from specdec.drafters.trees.siblings import EXACT_SIBLINGS
from specdec.models.backend import Backend
from specdec.verify.sampling import logits_to_probs, sample

log = logging.getLogger(__name__)

MAX_TREES = 1024  # tree shapes cached per drafter


@register("eagle")
class EagleDrafter(Drafter):
    """``model`` (an :class:`EagleModel` attached to the target's embeddings) drafting a chain or a tree, its
    forwards on ``backend``."""

    @dataclass
    class Config(DrafterConfig):
        name: str = "eagle"
        # draft tokens per target forward at most: tree nodes (lookup's included), or chain length; "auto": specdec.run
        k: Union[int, str] = 24
        path: str = DEFAULT_EAGLE  # "default" (shipped for SmolLM2-135M-Instruct) or an EAGLE-3 drafter directory
        tree: bool = True  # an EAGLE-2 tree of k nodes; false = a chain of k drafts
        depth: int = 6  # tree levels drafted
        top_k: int = 4  # children drafted per expanded node
        expand: int = 4  # nodes expanded per level (the most confident)
        # tree children at temperature > 0: null = draws without replacement there, unless lookup > 0 (fixed
        # top-k when greedy); false = always the fixed top-k tokens (one-hot q)
        sampled: Optional[bool] = None
        lookup: int = 8  # fixed-candidate trees: up to this many of the k nodes (half at most) hold the prompt-lookup
        # continuation
        # fixed-candidate trees: of the k most confident nodes keep those whose confidence (averaged over the
        # rows) reaches this (specdec.drafters.trees.dynamic); none = a plain step. 0 = always k nodes
        min_confidence: float = 0.2
        # Round the draft layer's, fc's and the draft LM head's weights to 8- or 4-bit codes per block of 32
        # (lossy for the drafts only; verification stays exact), which the CPU kernels stream as codes;
        # null = as trained. 4: drafting ~15% cheaper on a 2-core Xeon, τ within 0.02 (experiments/README.md)
        weight_bits: Optional[int] = 4

    def __init__(self, model: EagleModel, *, tree: bool = True, depth: int = 6, top_k: int = 4, expand: int = 4,
                 sampled: bool | None = None, lookup: int = 0, min_confidence: float = 0.0,
                 backend: Backend = Backend(), lookup_on_device: bool | None = None,
                 grow_on_device: bool | None = None):
        for name, value, low in (("depth", depth, 1), ("top_k", top_k, 1), ("expand", expand, 1), ("lookup", lookup, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"drafter.{name} must be an integer >= {low}, got {value!r}")
        if not 0.0 <= min_confidence < 1.0:
            raise ValueError(f"drafter.min_confidence must be in [0, 1) (0 = always k nodes), got {min_confidence}")
        if tree and sampled and lookup:
            raise ValueError(f"drafter.lookup={lookup} adds fixed candidates to a tree of sampled ones; set "
                             "drafter.sampled=false (or null) or drafter.lookup=0")
        if model.embed_weight is None:
            raise ValueError("the EAGLE model needs the target's input embeddings: call model.attach(embed_weight)")
        self.model = model.eval()
        self.backend = model.backend = backend  # the draft layer's forwards and logits run on it
        self.tree, self.depth, self.top_k, self.expand = tree, depth, top_k, min(expand, top_k)
        self.sampled, self.lookup, self.min_confidence = sampled, lookup, min_confidence
        self.token_ids = model.token_ids  # [Dv]
        self.trees = TreeCache(MAX_TREES)  # the trees verified, by parent list
        self.masks = TreeCache(MAX_TREES)  # the trees of a step's draft entries (:class:`TreeGrowth`)
        self.cache = None
        # a tree's children are sampled at temperature > 0 where ``sampled`` says so (null: unless a lookup branch asks
        # for fixed candidates)
        wanted = (not lookup) if sampled is None else sampled
        # a GPU grows a fixed tree of fixed candidates on the device (DeviceGrowth: nothing read back) and finds its
        # lookup branch there (lookup_branch's docstring); a CPU grows it on the host (TreeGrowth), which prunes
        # what cannot be selected: fewer draft forwards, and a host read costs nothing there
        on_gpu = model.fc.weight.device.type == "cuda"
        self.lookup_on_device = on_gpu if lookup_on_device is None else lookup_on_device
        self.grow_on_device = on_gpu if grow_on_device is None else grow_on_device
        # a chain is drafted on the device alone, and so is a fixed tree grown there where its lookup branch is found
        # there or it has none (a sampled one, at T > 0, reads its draws' places on the host)
        self.traits = Traits(feature_layers=tuple(model.cfg.aux_layers),
                             siblings=EXACT_SIBLINGS if tree and wanted else None,
                             device_only=not tree or self.fixed_tree_on_device(lookup))
        # the draft layer's forwards and logits replay graphs where the target's do (see the module docstring);
        # compiled or not, the same graphs
        self.runtime = DraftRuntime(backend, device=lambda: self.model.fc.weight.device)

    @classmethod
    def from_config(cls, cfg, target=None, tokenizer=None, backend=Backend()) -> "EagleDrafter":
        from specdec.models import as_decoder

        decoder = as_decoder(target)
        path = default_eagle_path() if cfg.path in (None, "", DEFAULT_EAGLE) else Path(cfg.path).expanduser()
        model = load_eagle(path, target_config=decoder.config)
        embed = on_target(model, target)
        round_weights(model, cfg.weight_bits, keep=(embed,), what="EAGLE drafter")
        log.info("EAGLE drafter %s (feature layers %s, draft vocabulary %d)", path, list(model.cfg.aux_layers),
                 model.cfg.draft_vocab_size)
        return cls(model, tree=cfg.tree, depth=cfg.depth, top_k=cfg.top_k, expand=cfg.expand, sampled=cfg.sampled,
                   lookup=cfg.lookup, min_confidence=cfg.min_confidence, backend=backend)

    # ---- one generation -------------------------------------------------------------------------------

    def start(self, state: DecodeState) -> None:
        cfg = self.model.cfg
        check_state(state, cfg, "EAGLE drafter")
        margin = 2 * (self.depth * self.expand + state.features.shape[1] + 8)
        self.cache = self.runtime.new_cache(self.model.new_cache, state.seq.shape[0], state.capacity + margin, state.pad)

    def observe(self, state: DecodeState) -> None:
        """Nothing to do yet: the next :meth:`propose` catches up on what was committed (``state.features``)."""

    @torch.no_grad()
    def catch_up(self, state: DecodeState) -> torch.Tensor:  # -> [B, H]: the draft layer at the newest position
        """Feed the positions committed since the last step (their features and the tokens that followed
        them) into the draft cache and commit them."""
        cache, feats = self.cache, state.features
        t, capacity = feats.shape[1], state.capacity
        replayed = replays_catch_up(self.runtime, state)
        kv_len = None if replayed else state.max_seq_len + t  # graphs attend over the whole cache

        def run(feats, seq, seq_lens):  # no commit inside: a graph's warm-up runs it more than once
            in_one = getattr(self.backend.fused_kernels(feats), "catch_up_inputs", None)  # the Triton kernels'
            if in_one is not None:  # one kernel where the ops below are ~13
                tokens, positions, count, last = in_one(seq, seq_lens, cache.lengths, cache.pad, t, capacity)
            else:
                base = cache.lengths
                steps = torch.arange(t, device=base.device)
                tokens = seq.gather(1, (base[:, None] + 1 + steps).clamp_(max=capacity - 1))  # [B, T]: each one's next
                positions = cache.positions(steps).clamp_(min=0)
                count = (seq_lens - 1 - base).clamp_(min=0, max=t)  # [B] new positions per row
                last = torch.arange(count.shape[0], device=count.device) * t + (count - 1).clamp(min=0)  # flat index
            out = self.model.step(self.model.fuse(feats), tokens, cache, positions, kv_len)
            return out.reshape(-1, out.shape[-1])[last], count  # each row's newest

        inputs = (feats, state.seq, state.seq_lens)  # the tokens are gathered inside: no ops between the graphs
        out, count = self.runtime.call(run, inputs, key="catch_up") if replayed else run(*inputs)
        cache.commit(count)
        self.runtime.forwards += 1
        return out

    def draft_probs(self, logits: torch.Tensor, state: DecodeState) -> torch.Tensor:  # [B, n, Dv] -> [B, n, Dv]
        """The draft distribution q after the target's temperature/top-k/top-p (over the draft vocabulary:
        tokens outside it have q = 0, as the full-vocabulary q reported to the verifier says)."""
        p = state.sampling
        if self.token_ids.numel() == state.vocab_size or (p.top_k == 0 and p.top_p >= 1.0):
            return logits_to_probs(logits, p.temperature, p.top_k, p.top_p)
        full = logits.new_full((*logits.shape[:-1], state.vocab_size), float("-inf"))
        full[..., self.token_ids] = logits
        return logits_to_probs(full, p.temperature, p.top_k, p.top_p)[..., self.token_ids]

    def full_vocab(self, q: torch.Tensor, vocab_size: int) -> torch.Tensor:  # [B, n, Dv] -> [B, n, V]
        return q.new_zeros(*q.shape[:-1], vocab_size).index_copy_(-1, self.token_ids, q)

    @torch.no_grad()
    def propose(self, state: DecodeState, k: int) -> Proposal:
        hidden = self.catch_up(state)  # [B, H]
        lookup = min(self.lookup, k // 2)  # a tree's lookup branch takes at most half of the k nodes
        if self.tree and self.grows_on_device(state, lookup):  # its graph rolls its entries back: no ops around it
            return self.propose_device_tree(state, hidden, k - lookup, lookup)
        committed = self.cache.lengths.clone()
        try:
            if self.tree:
                return self.propose_tree(state, hidden, k - lookup, lookup)
            return self.propose_chain(state, hidden, k)
        finally:
            self.cache.rollback_to(committed)  # the drafts' entries are forgotten; catch_up rewrites them

    def fixed_tree_on_device(self, lookup: int) -> bool:
        """Whether a tree of fixed candidates is :class:`DeviceGrowth`'s: grown on the device, no pruning, and a lookup
        branch (``lookup`` nodes) found on the device where it has one."""
        return self.grow_on_device and self.min_confidence == 0 and (lookup == 0 or self.lookup_on_device)

    def grows_on_device(self, state: DecodeState, lookup: int) -> bool:
        """Whether this step's tree is :class:`DeviceGrowth`'s: :meth:`fixed_tree_on_device`, no sampled children."""
        return not self.traits.samples_siblings(state.sampling) and self.fixed_tree_on_device(lookup)

    def extend(self, hidden: torch.Tensor, tokens: torch.Tensor, state: DecodeState, level: int, drafted: int,
               tree: torch.Tensor | None = None) -> torch.Tensor:
        """Draft entries for tokens at ``level`` past the newest committed position: hidden [B, n, H], tokens
        [B, n] -> [B, n, H]. Written after the cache's (temporarily) committed entries, the ``drafted`` this step
        wrote before them, and committed too (``propose`` rolls them back); ``tree`` [n, drafted + n]: which of
        this step's draft entries (those written before, then these) each sees (None: all before it, a chain)."""
        n, cache = tokens.shape[1], self.cache
        kv_len = None if self.runtime.graphs is not None else min(state.max_seq_len + drafted + n + 1, cache.capacity)

        def run(hidden, tokens, *mask):
            first = cache.lengths - drafted - cache.pad  # [B] position of the first draft entry
            positions = (first + level)[:, None].expand(-1, n)
            return (self.model.step(hidden, tokens, cache, positions, kv_len, mask[0] if mask else None,
                                    drafted if mask else 0),)  # no commit inside (see catch_up)

        out, = self.runtime.call(run, (hidden, tokens) if tree is None else (hidden, tokens, tree),
                          key=("draft", level, drafted, tree is None))
        cache.commit(torch.full_like(cache.lengths, n))
        self.runtime.forwards += 1
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [B, n, H] or [B, H] -> [..., Dv] float32
        """The draft layer's logits over the draft vocabulary at ``hidden``."""
        return self.runtime.call(lambda hidden: (self.model.logits(hidden),), (hidden,), key="logits")[0]

    def top_candidates(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # -> [B, P, top_k] x 2
        """The ``top_k`` likeliest draft tokens at each of ``hidden`` [B, P, H]: their log-probabilities and
        draft-vocabulary indices."""
        def run(hidden):
            return self.backend.top_log_softmax(self.model.logits(hidden), self.top_k)

        return self.runtime.call(run, (hidden,), key="top")

    def propose_chain(self, state: DecodeState, hidden: torch.Tensor, k: int) -> Proposal:
        greedy = state.sampling.greedy
        tokens, probs = [], []
        for i in range(k):
            logits = self.logits(hidden)  # [B, Dv]
            if greedy:
                index = logits.argmax(-1)
            else:
                q = self.draft_probs(logits[:, None], state)[:, 0]  # [B, Dv]
                index = sample(q, state.generator)
                probs.append(q)
            tokens.append(self.token_ids[index])
            if i + 1 < k:
                hidden = self.extend(hidden[:, None], tokens[-1][:, None], state, i, drafted=i)[:, 0]
        drafts = torch.stack(tokens, 1)
        return Proposal(tokens=drafts, num_proposed=[k] * drafts.shape[0],
                        probs=None if greedy else self.full_vocab(torch.stack(probs, 1), state.vocab_size))

    def propose_device_tree(self, state: DecodeState, hidden: torch.Tensor, n: int, lookup: int) -> Proposal:
        """:class:`DeviceGrowth`'s tree of ``n`` nodes after a lookup chain of ``lookup``, nothing read back."""
        tokens, counted, shape = DeviceGrowth(self, n, lookup).propose(state, hidden)
        return Proposal(tokens=tokens, num_proposed=[tokens.shape[1]] * tokens.shape[0], tree=shape, counted=counted)

    def propose_tree(self, state: DecodeState, hidden: torch.Tensor, n: int, lookup: int) -> Proposal:
        """A tree grown on the host (:class:`TreeGrowth`) of up to ``n`` nodes, then a lookup branch of up to
        ``lookup`` nodes."""
        tree = TreeGrowth(self, state, self.traits.samples_siblings(state.sampling), self.masks)
        tree.grow(hidden, n)
        tokens, parents, probs = tree.select(n)
        filler = [0] * tokens.shape[0]
        if lookup:
            found = continuations(state.tokens, state.active, lookup)
            tokens, merged, filler = add_branch(tokens, parents, found, [row[-1] for row in state.tokens])
            parents = merged
        if not parents:
            return Proposal(tokens=tokens[:, :0], num_proposed=[0] * tokens.shape[0])
        return Proposal(tokens=tokens, num_proposed=[tokens.shape[1] - f for f in filler],
                        probs=None if probs is None else self.full_vocab(probs, state.vocab_size),
                        tree=self.trees.get(tuple(parents), tokens.device))
