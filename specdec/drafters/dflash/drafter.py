"""The block drafter: a DFlash-style model (:mod:`specdec.drafters.dflash.model`) drafting a whole block a forward.

Each step first *catches up*: the positions the target committed since the last step (``DecodeState.features``)
enter the drafter's cache as context keys and values of every draft layer (no layer runs on them). Then one
forward of the draft layers over the block [newest token, mask, .., mask] gives B − 1 per-position draft
distributions at once. They are candidates exactly as Medusa's heads' are (position i plays head i: each
depends on the context and the anchor, not on the drafts before it), so the same strategies draft with them
(:mod:`specdec.drafters.medusa.drafter`):

- **chain** (``tree: null``): draft i is drawn from position i's q (argmax when greedy), the first k positions;
  verified by the exact rule with those q (independent drafts are allowed: each comes from the q it reports);
- **tree** (``tree: default``, the tree stored with the drafter, chosen on held-out data when it was trained; or
  a list of paths): candidates are the top-ranked tokens of each position combined along paths
  (:mod:`specdec.drafters.trees.plan`), fixed tokens (one-hot q), verified by recursive rejection sampling;
  ``min_confidence`` keeps the confident part (:mod:`specdec.drafters.trees.dynamic`) and ``lookup`` adds the
  prompt-lookup branch, as for Medusa.

One draft forward whatever k: the cost of a step does not grow with the drafts, only the verification's does.
On CPU the forward goes through specdec's kernels (the weights as 4-bit codes by default, ``weight_bits``); where
the target's forwards replay graphs (a GPU) the catch-up and the block forward replay graphs too (over the cache the
graphs keep), and so do a tree's candidates (the LM head over the block, its top-k and the nodes' tokens); a chain's
draws run eagerly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch

from specdec.config import DrafterConfig
from specdec.drafters.base import (DecodeState, Drafter, DraftRuntime, Proposal, Traits, register, replays_catch_up,
                                  round_weights)
from specdec.drafters.dflash.model import DEFAULT_DFLASH, DFlashModel, default_dflash_path, load_dflash
from specdec.drafters.features import check_state, on_target
from specdec.drafters.trees.drafting import ChainDrafting, IndependentHeads, TreeDrafting
from specdec.drafters.trees.plan import check_paths
from specdec.models.backend import Backend

log = logging.getLogger(__name__)


class BlockPositions:
    """The block's masked positions seen as Medusa-1 heads (what :class:`IndependentHeads` calls): called on the
    block's hidden states [B, B-1, H], position i's logits over the draft vocabulary are head i's."""

    def __init__(self, model: DFlashModel):
        self.model = model
        full = model.cfg.draft_vocab_size == model.cfg.vocab_size
        self.token_ids = None if full else model.token_ids  # [Dv] target ids, None = the whole vocabulary

    @property
    def num_heads(self) -> int:
        return self.model.cfg.block_size - 1

    def to_token_ids(self, index: torch.Tensor) -> torch.Tensor:
        return index if self.token_ids is None else self.token_ids[index]

    def __call__(self, hidden: torch.Tensor, lm_head_weight: Any = None, num_heads: int | None = None,
                 ) -> torch.Tensor:  # hidden [B, B-1, H] -> [B, num_heads, Dv]
        return self.model.logits(hidden[:, :num_heads])


@register("dflash")
class DFlashDrafter(Drafter):
    """``model`` (a :class:`DFlashModel` attached to the target's embeddings) drafting a chain (``paths`` None)
    or the tree of ``paths``; its forwards on ``backend``."""

    @dataclass
    class Config(DrafterConfig):
        name: str = "dflash"
        # draft tokens per target forward at most: tree nodes (lookup's included), or chain length (<= block - 1)
        k: Union[int, str] = 16
        path: str = DEFAULT_DFLASH  # "default" (shipped for SmolLM2-135M-Instruct) or a block drafter directory
        tree: Any = "default"  # "default" = the tree stored with the drafter; null = a chain; or a list of paths
        # of the first k paths keep those whose confidence (product of the positions' probabilities along the
        # path, averaged over the rows) reaches this; none = a plain step. 0 = the fixed tree of k paths
        min_confidence: float = 0.2
        lookup: int = 8  # trees only (a chain ignores it): up to this many of the k nodes hold the lookup continuation
        # the draft layers' and LM head's weights rounded to 8- or 4-bit codes per block of 32, streamed as such by the
        # CPU kernels (lossy for the drafts only: verification stays exact); null = as trained
        weight_bits: Optional[int] = 4

    def __init__(self, model: DFlashModel, paths: list[list[int]] | None = None, *, min_confidence: float = 0.0,
                 lookup: int = 0, backend: Backend = Backend()):
        if model.embed_weight is None:
            raise ValueError("the block drafter needs the target's input embeddings: call model.attach(embed_weight)")
        if not 0.0 <= min_confidence < 1.0:
            raise ValueError(f"drafter.min_confidence must be in [0, 1) (0 = a fixed tree), got {min_confidence}")
        if isinstance(lookup, bool) or not isinstance(lookup, int) or lookup < 0:
            raise ValueError(f"drafter.lookup must be an integer >= 0, got {lookup!r}")
        self.model = model.eval()
        self.backend = model.backend = backend
        self.positions = BlockPositions(model)
        self.paths = None if paths is None else check_paths(paths, self.positions.num_heads)
        self.lookup = lookup if self.paths is not None else 0  # the lookup branch joins a tree; a chain has none
        candidates = IndependentHeads(self.positions, model.lm_head.weight, backend)
        on_device = model.lm_head.weight.device.type == "cuda"  # a GPU finds the lookup branch on the device
        self.drafting = (ChainDrafting(candidates, self.positions, min_confidence) if self.paths is None
                         else TreeDrafting(candidates, self.paths, min_confidence, lookup, on_device))
        self.cache = self.last = None
        # a tree drafts at its lookup nodes and at least one of its paths; a chain at one draft per masked position
        sizes = (range(1, self.positions.num_heads + 1) if self.paths is None
                 else range(self.lookup + 1, self.lookup + len(self.paths) + 1))
        # a fixed tree or chain is drafted on the device alone where its lookup branch is (a GPU's) or it has none (a
        # dynamic tree's kept nodes are read on the host)
        self.traits = Traits(feature_layers=tuple(model.cfg.aux_layers), sizes=sizes,
                             device_only=min_confidence == 0 and (self.lookup == 0 or on_device))
        # the catch-up's context write and the block forward replay graphs where the target's forwards do (a GPU; both
        # are fixed shapes but the catch-up's count of positions), and so do a tree's candidates and a lookup branch
        # found on the device; a chain's draws run eagerly
        self.runtime = DraftRuntime(backend, device=lambda: self.model.fc.weight.device, route=self._use_graphs)

    def _use_graphs(self, graphs, compile: bool) -> None:
        if isinstance(self.drafting, TreeDrafting):  # the tree's candidates, the device's lookup branch
            self.drafting.candidates.graphs = self.drafting.graphs = graphs
        # the catch-up and the block forward replay through runtime.call

    @classmethod
    def from_config(cls, cfg, target=None, tokenizer=None, backend=Backend()) -> "DFlashDrafter":
        from specdec.models import as_decoder

        decoder = as_decoder(target)
        path = default_dflash_path() if cfg.path in (None, "", DEFAULT_DFLASH) else Path(cfg.path).expanduser()
        if path == default_dflash_path() and not (path / "config.json").is_file():
            raise FileNotFoundError(f"the shipped block drafter is not at {str(path)!r} (an install without its "
                                    f"assets?): reinstall specdec, or train one with `python -m specdec.train "
                                    f"method=dflash export=<dir>` and pass drafter.path=<dir>")
        model = load_dflash(path, target_config=decoder.config)
        embed = on_target(model, target)
        # fc stays as stored: its columns for the target's massive channels (layers 15 and 27 of SmolLM2 reach ~25,000
        # where the RMS is ~66; the scale folded in at training) are ~1e-4 beside ~1e-2 in the same blocks of 32, which
        # codes would round to garbage (measured: 4-bit errors of 2-8x those columns' norms)
        round_weights(model, cfg.weight_bits, keep=(embed, model.fc.weight), what="block drafter")
        if cfg.tree == "default":
            paths = model.cfg.extra.get("tree")
            if not paths:
                raise ValueError(f"{str(path)!r} stores no tree; give drafter.tree=[[0],[1],[0,0],...] or null (a chain)")
        else:
            paths = None if cfg.tree is None else [list(p) for p in cfg.tree]
        log.info("block drafter %s (block %d, %d layers, feature layers %s, draft vocabulary %d, %s)", path,
                 model.cfg.block_size, model.cfg.num_layers, list(model.cfg.aux_layers), model.cfg.draft_vocab_size,
                 "a chain" if paths is None else f"a tree of {len(paths)} paths")
        return cls(model, paths, min_confidence=cfg.min_confidence, lookup=cfg.lookup, backend=backend)

    # ---- one generation -------------------------------------------------------------------------------

    def start(self, state: DecodeState) -> None:
        cfg = self.model.cfg
        check_state(state, cfg, "block drafter")
        margin = 2 * (cfg.block_size + state.features.shape[1] + 8)
        self.cache = self.runtime.new_cache(self.model.new_cache, state.seq.shape[0], state.capacity + margin, state.pad)
        self.last = torch.zeros(state.seq.shape[0], cfg.hidden_size, dtype=self.model.fc.weight.dtype,
                                device=state.seq.device)  # [B, H]: each row's newest committed context

    def observe(self, state: DecodeState) -> None:
        """Nothing to do yet: the next :meth:`propose` catches up on what was committed (``state.features``)."""

    @torch.no_grad()
    def catch_up(self, state: DecodeState) -> None:
        """The positions committed since the last step enter the cache as context (and are committed there)."""
        cache, feats = self.cache, state.features
        t = feats.shape[1]
        replayed = replays_catch_up(self.runtime, state)
        kv_len = None if replayed else min(state.max_seq_len + t + 1, cache.capacity)  # graphs: the whole cache

        def run(feats, seq_lens, last):  # no commit inside: a graph's warm-up runs it more than once
            in_one = getattr(self.backend.fused_kernels(last), "catch_up_inputs", None)  # the Triton kernels'
            if in_one is not None:  # the count, positions and newest's index in one kernel where torch's ops are ~10
                _, positions, count, at = in_one(None, seq_lens, cache.lengths, cache.pad, t, cache.capacity)
            else:  # the positions: write_context's
                positions = None
                count = (seq_lens - 1 - cache.lengths).clamp(min=0, max=t)  # per row: its positions before the newest
                at = torch.arange(count.shape[0], device=count.device) * t + (count - 1).clamp(min=0)  # flat index
            context = self.model.write_context(feats, cache, kv_len, positions)  # [B, T, H]
            newest = context.reshape(-1, context.shape[-1])[at]
            return torch.where((count > 0)[:, None], newest, last), count

        inputs = (feats, state.seq_lens, self.last)
        self.last, count = self.runtime.call(run, inputs, key="catch_up") if replayed else run(*inputs)
        cache.commit(count)

    @torch.no_grad()
    def propose(self, state: DecodeState, k: int) -> Proposal:
        self.catch_up(state)
        graphed = self.runtime.graphs is not None
        kv_len = None if graphed else min(state.max_seq_len + self.model.cfg.block_size + 1, self.cache.capacity)

        def run(anchors, last):  # the block's entries are written uncommitted: a rerun writes them the same
            return (self.model.draft_block(anchors, last, self.cache, kv_len)[:, 1:],)  # [B, B-1, H]

        hidden, = self.runtime.call(run, (state.last_tokens, self.last), key="block")
        self.runtime.forwards += 1
        return self.drafting.propose(state, hidden, k)
