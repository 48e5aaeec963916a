"""Chains and trees drafted from per-position candidates, whatever model gives them: Medusa's heads, the block
drafter's masked positions.

- :class:`Heads`: what a drafter's per-position distributions look like to the strategies here (``num_heads``
  positions, called on a hidden state over the draft LM-head rows, indices mapped to target ids);
- :class:`IndependentHeads` (Medusa-1's way): every position read from the hidden state alone, one call drafting
  everything; a token-aware kind (Medusa's Hydra heads, :class:`~specdec.drafters.medusa.candidates.TokenAwareHeads`)
  answers the same two calls, ``chain`` and ``tree``;
- :class:`ChainDrafting`: one draft per position from the first k (dynamic: cut where confidence falls short);
- :class:`TreeDrafting`: the first k paths of a tree of candidate ranks (:mod:`~specdec.drafters.trees.plan`;
  dynamic: the confident part, :mod:`~specdec.drafters.trees.dynamic`), plus a prompt-lookup branch
  (:mod:`~specdec.drafters.trees.lookup_branch`).

Where graphs replay (a GPU), a tree's drafting is a few dozen small kernels that each cost a launch:
``IndependentHeads.graphs`` (a :class:`~specdec.models.graphs.Graphs`) then replays it, the whole tree in one graph.
"""

from __future__ import annotations

from typing import Protocol

import torch

from specdec.drafters.base import DecodeState, Proposal
from specdec.drafters.trees.dynamic import confident_prefix, kept_nodes, path_logprobs
from specdec.drafters.ngram import state_continuations
from specdec.drafters.trees.lookup_branch import add_branch, below_branch, continuations
from specdec.drafters.trees.plan import PlanCache, TreeCache, TreePlan
from specdec.models.backend import Backend
from specdec.models.graphs import Graphs
from specdec.verify.sampling import logits_to_probs, sample
from specdec.verify.tree import Tree

MAX_TREES = 1024  # tree shapes cached per drafter (a lookup branch merged in makes many)


class Heads(Protocol):
    """Per-position draft distributions: ``heads(hidden [B, H], lm_head_weight [V', H], num_heads=k)`` -> logits
    [B, k, V'] of the first k positions; draft indices to target ids; the draft vocabulary's target ids (None:
    the full vocabulary)."""

    num_heads: int
    token_ids: torch.Tensor | None

    def __call__(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor, *, num_heads: int) -> torch.Tensor: ...

    def to_token_ids(self, index: torch.Tensor) -> torch.Tensor: ...


class Candidates(Protocol):
    """What chain and tree drafting call (:class:`IndependentHeads`, Medusa's token-aware heads)."""

    def chain(self, state: DecodeState, hidden: torch.Tensor, k: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def tree(self, state: DecodeState, hidden: torch.Tensor, plan: TreePlan, min_confidence: float | None = None
             ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


class IndependentHeads:
    """Heads on the hidden state alone; ``lm_head_weight`` [V', H] are the draft vocabulary's LM-head rows."""

    def __init__(self, heads: Heads, lm_head_weight: torch.Tensor, backend: Backend = Backend()):
        self.heads = heads
        self.lm_head_weight = lm_head_weight
        self.backend = backend  # the candidates' top-k (:meth:`Backend.top_k`: one or two kernels on a GPU)
        self.graphs: Graphs | None = None  # where set, trees are drafted by replayed graphs

    def chain(
        self,
        state: DecodeState,
        hidden: torch.Tensor,  # [B, H] in the heads' dtype
        k: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # logits [B, k, V'], q [B, k, V'], draws [B, k]
        """Draft i drawn from head i's q; the drafts are independent of each other, which the rejection
        rule allows: it only needs each draft to come from the q it reports."""
        params = state.sampling
        logits = self.heads(hidden, self.lm_head_weight, num_heads=k).float()  # [B, k, V']
        q = logits_to_probs(logits, params.temperature, params.top_k, params.top_p)  # [B, k, V']
        return logits, q, sample(q, state.generator)

    def tree(
        self,
        state: DecodeState,
        hidden: torch.Tensor,  # [B, H] in the heads' dtype
        plan: TreePlan,  # of N nodes
        min_confidence: float | None = None,  # a dynamic tree's: the path log-probabilities are wanted
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # tokens [B, N], path log-probabilities [B, N] or None
        """Every node's token from one call of the heads (the path log-probabilities only when asked for)."""
        wanted = min_confidence is not None

        def draft(hidden):
            return self._tree(hidden, plan, wanted)

        out = draft(hidden) if self.graphs is None else self.graphs(draft, (hidden,), key=(id(plan), wanted), hold=plan)
        return out[0], out[1] if wanted else None

    def _tree(self, hidden: torch.Tensor, plan: TreePlan, wanted: bool) -> tuple[torch.Tensor, ...]:
        logits = self.heads(hidden, self.lm_head_weight, num_heads=plan.tree.max_depth)  # [B, D, V']
        # [B, D, r]: each head's candidates, best first, as log-probabilities where wanted
        values, indices = self.backend.top_k(logits, plan.top, log_probs=wanted)
        tokens = self.heads.to_token_ids(indices)[:, plan.level, plan.rank]  # [B, N]
        if not wanted:
            return (tokens,)
        return tokens, path_logprobs(values[:, plan.level, plan.rank], plan.tree)





class ChainDrafting:
    """One draft per head, from the first k heads (dynamic: cut where confidence falls short)."""

    def __init__(self, candidates: Candidates, heads: Heads, min_confidence: float):
        self.candidates, self.heads, self.min_confidence = candidates, heads, min_confidence

    def propose(self, state: DecodeState, hidden: torch.Tensor, k: int) -> Proposal:  # hidden [B, H]
        if k > self.heads.num_heads:
            raise ValueError(f"chain drafting proposes one token per head: k={k} exceeds the "
                             f"{self.heads.num_heads} heads; lower k")
        logits, q, index = self.candidates.chain(state, hidden, k)  # [B, k, V'], [B, k, V'], [B, k]
        if self.min_confidence > 0:
            k = confident_prefix(logits, index, self.min_confidence)
            if k == 0:
                return Proposal(tokens=index[:, :0], num_proposed=[0] * index.shape[0])
            index, q = index[:, :k], q[:, :k]
        tokens = self.heads.to_token_ids(index)  # [B, k]
        token_ids = self.heads.token_ids
        if not state.sampling.greedy and token_ids is not None:  # q over the full vocabulary, 0 elsewhere
            q = q.new_zeros(*q.shape[:-1], state.vocab_size).index_copy_(-1, token_ids, q)
        return Proposal(tokens=tokens, probs=None if state.sampling.greedy else q, num_proposed=[k] * tokens.shape[0])


class TreeDrafting:
    """The first k − ``lookup`` paths' tree (dynamic: the confident part of it), plus the lookup branch."""

    def __init__(self, candidates: Candidates, paths: list[list[int]], min_confidence: float, lookup: int,
                 lookup_on_device: bool = False):
        self.candidates, self.paths, self.lookup = candidates, paths, lookup
        self.min_confidence = min_confidence if min_confidence > 0 else None
        # a fixed tree's lookup branch found on the device, a fixed chain (a GPU; a dynamic tree reads the host anyway)
        self.lookup_on_device = lookup_on_device and self.min_confidence is None
        self.plans = PlanCache(paths)
        self.trees = TreeCache(MAX_TREES)
        self.graphs: Graphs | None = None  # where set (its drafter's), the device's lookup replays a graph

    def propose(self, state: DecodeState, hidden: torch.Tensor, k: int) -> Proposal:  # hidden [B, H]
        if k <= self.lookup:
            raise ValueError(f"k={k} tree nodes, {self.lookup} of them for the prompt-lookup branch, leave none for "
                             f"the heads' tree; raise k or lower lookup")
        if k - self.lookup > len(self.paths):
            raise ValueError(f"k={k} tree nodes requested ({self.lookup} for the prompt-lookup branch), but the tree "
                             f"lists only {len(self.paths)} paths; lower k or give a larger drafter.tree")
        tokens, tree = self.heads_tree(state, hidden, k - self.lookup)
        filler, counted = [0] * tokens.shape[0], None
        if self.lookup and self.lookup_on_device:
            heads = tokens.shape[1]
            tokens, tree, found = self.add_device_lookup(state, tokens, tree)
            counted = found + heads  # the branch's genuine nodes, counted on the device
        elif self.lookup:
            tokens, tree, filler = self.add_lookup(state, tokens, tree)
        if tree is None:  # no path is worth its verification, no continuation found: a plain step
            return Proposal(tokens=tokens[:, :0], num_proposed=[0] * tokens.shape[0])
        return Proposal(tokens=tokens, num_proposed=[tokens.shape[1] - f for f in filler], tree=tree, counted=counted)

    def heads_tree(self, state: DecodeState, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, Tree | None]:
        """The heads' tree of the first k paths (dynamic: those confident enough): tokens [B, N], its shape
        (None when no path is kept)."""
        device = state.last_tokens.device
        plan = self.plans.get(tuple(range(k)), device)
        tokens, path_logp = self.candidates.tree(state, hidden, plan, self.min_confidence)  # [B, k], [B, k]
        if self.min_confidence is None:
            return tokens, plan.tree
        nodes = kept_nodes(path_logp, self.min_confidence)
        if not nodes:
            return tokens[:, :0], None
        return tokens[:, list(nodes)], self.plans.get(nodes, device).tree

    def add_device_lookup(self, state: DecodeState, tokens: torch.Tensor, tree: Tree | None
                          ) -> tuple[torch.Tensor, Tree, torch.Tensor]:
        """The lookup branch found on the device (:func:`state_continuations`), a chain of ``lookup`` nodes below
        the root before the heads' tree (tokens [B, N]), filled with each row's last token where shorter: a shape
        fixed whatever the rows hold, nothing read back; with each row's genuine branch nodes ([B], on the device)."""
        branch, found = state_continuations(state, self.lookup, self.graphs,
                                            backend=getattr(self.candidates, "backend", None))
        parents = below_branch(() if tree is None else tree.parent_list, self.lookup)
        return torch.cat([branch, tokens], 1), self.trees.get(parents, tokens.device), found

    def add_lookup(self, state: DecodeState, tokens: torch.Tensor,
                   tree: Tree | None) -> tuple[torch.Tensor, Tree | None, list[int]]:
        """Each row's lookup continuation added to the heads' tree (tokens [B, N]): the new tokens [B, N'],
        tree, and each row's filler nodes."""
        found = continuations(state.tokens, state.active, self.lookup)
        parents = () if tree is None else tree.parent_list
        tokens, merged, filler = add_branch(tokens, parents, found, [row[-1] for row in state.tokens])
        return tokens, tree if merged == parents else self.trees.get(merged, tokens.device), filler
