"""Medusa's token-aware heads (:class:`TokenAwareHeads`, Hydra's sequentially dependent heads), called one level at
a time given the path.

They answer the two calls chain and tree drafting make (:class:`~specdec.drafters.trees.drafting.Candidates`), as
Medusa-1's independent heads do (:class:`~specdec.drafters.trees.drafting.IndependentHeads`, shared with the block
drafter), so the strategies need not know which heads they run:

- ``chain(state, hidden, k)``: one draft per head for the first k heads, each drawn from the q it reports
  (argmax when greedy): the logits, q and draws over the draft vocabulary;
- ``tree(state, hidden, plan, min_confidence)``: the token of every node of a tree plan
  (:mod:`specdec.drafters.trees.plan`) and the nodes' path log-probabilities, which a dynamic tree prunes by
  (:mod:`specdec.drafters.trees.dynamic`).

Token-aware heads also read the embeddings of the emitted token and of the drafts before their own, so a chain is
drafted head by head and a tree level by level: a node's candidates are the top tokens of its depth's head given the
node's path, one small head call per level.

Where graphs replay (a GPU; the drafter's ``runtime.replay_graphs``), a tree's drafting is a few dozen small kernels
that each cost a launch: ``graphs`` (a :class:`~specdec.models.graphs.Graphs`) then replays it, one graph per level
for a dynamic tree (whose levels depend on which parents are confident, read on the host between levels; a level cut
to its confident part runs eagerly).
"""

from __future__ import annotations

import math

import torch

from specdec.drafters.base import DecodeState
from specdec.drafters.medusa.heads import MedusaHeads
from specdec.drafters.trees.dynamic import open_part
from specdec.drafters.trees.plan import Level, TreePlan
from specdec.models.graphs import Graphs
from specdec.verify.sampling import logits_to_probs, sample


class TokenAwareHeads:
    """Token-aware heads; ``embed_weight`` [V, H] are the target's input embeddings (any dtype: each lookup
    is cast to the heads')."""

    def __init__(self, heads: MedusaHeads, lm_head_weight: torch.Tensor, embed_weight: torch.Tensor):
        self.heads = heads
        self.lm_head_weight = lm_head_weight  # [V', H]
        self.embed_weight = embed_weight
        self.dtype = next(heads.parameters()).dtype
        self.graphs: Graphs | None = None  # where set, trees are drafted by replayed graphs

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:  # [...] long -> [..., H] in the heads' dtype
        return self.embed_weight[tokens].to(self.dtype)

    def chain(
        self,
        state: DecodeState,
        hidden: torch.Tensor,  # [B, H] in the heads' dtype
        k: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # logits [B, k, V'], q [B, k, V'], draws [B, k]
        """Drafts one head at a time, each head reading the drafts before it: draft i is drawn from
        q_i( · | the emitted token, drafts 0..i-1), the q_i that is reported — what rejection sampling needs."""
        params = state.sampling
        known = self.embed(state.last_tokens)[:, None]  # [B, 1, H]
        logits, qs, index = [], [], []
        for i in range(k):
            logit = self.heads(hidden, self.lm_head_weight, num_heads=i + 1, known=known, first=i)[:, 0].float()
            q = logits_to_probs(logit, params.temperature, params.top_k, params.top_p)  # [B, V']
            draw = sample(q, state.generator)  # [B]
            logits.append(logit), qs.append(q), index.append(draw)
            known = torch.cat([known, self.embed(self.heads.to_token_ids(draw))[:, None]], 1)
        return torch.stack(logits, 1), torch.stack(qs, 1), torch.stack(index, 1)

    def tree(
        self,
        state: DecodeState,
        hidden: torch.Tensor,  # [B, H] in the heads' dtype
        plan: TreePlan,  # of N nodes
        min_confidence: float | None = None,  # a dynamic tree's: draft only below parents it keeps
    ) -> tuple[torch.Tensor, torch.Tensor]:  # tokens [B, N], path log-probabilities [B, N]
        """Drafts level by level: a node's candidates are the top tokens of its depth's head given the emitted
        token and the tokens on the node's path. With ``min_confidence`` only the nodes below parents that
        pass :func:`~specdec.drafters.trees.dynamic.confident` are drafted (the others: token 0, path
        log-probability -inf); exactly the nodes that could pass themselves, as a path is never likelier
        than its parent, so an unpromising step costs one head call."""
        if self.graphs is not None and min_confidence is None:  # a fixed tree: one graph drafts it all

            def draft(hidden, last_tokens):
                return self._tree(hidden, last_tokens, plan, None, eager=True)

            return self.graphs(draft, (hidden, state.last_tokens), key=id(plan), hold=plan)
        return self._tree(hidden, state.last_tokens, plan, min_confidence, eager=self.graphs is None)

    def _tree(self, hidden: torch.Tensor, last_tokens: torch.Tensor, plan: TreePlan, min_confidence: float | None,
              eager: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`tree`'s work; ``eager``: no level through ``graphs`` (inside a graph, or none)."""
        batch, n = last_tokens.shape[0], plan.level.numel()
        tokens = last_tokens.new_zeros(batch, n)
        path_logp = hidden.new_full((batch, n), -math.inf, dtype=torch.float32)
        known = self.embed(last_tokens)[:, None, None]  # [B, 1, 1, H]: the root's path
        above_logp = path_logp.new_zeros(batch, 1)  # [B, 1]: the root's
        for depth, level in enumerate(plan.levels):
            part = level if min_confidence is None or not depth else open_part(
                level, above_logp[:, level.above], min_confidence)
            if part is None:
                break

            def draft(hidden, known, above_logp, part=part, depth=depth):
                return self._level(hidden, known, above_logp, part, depth)

            graphed = not eager and part is level  # a whole level of the plan: the same each step
            drafted, above_logp, known = (self.graphs(draft, (hidden, known, above_logp), key=id(level), hold=level)
                                          if graphed else draft(hidden, known, above_logp))
            tokens[:, part.nodes], path_logp[:, part.nodes] = drafted, above_logp
            if part is not level:  # the next level finds its parents by position in the whole level
                known, above_logp = level.spread(known, part, 0.0), level.spread(above_logp, part, -math.inf)
        return tokens, path_logp

    def _level(self, hidden: torch.Tensor, known: torch.Tensor, above_logp: torch.Tensor, part: Level,
               depth: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The nodes of ``part`` (a level at ``depth``, or its part below confident parents) drafted from the paths
        ``known`` [B, P', depth+1, H] and path log-probabilities ``above_logp`` [B, P'] of the level above: their
        tokens [B, n'], path log-probabilities [B, n'] and paths [B, n', depth+2, H]."""
        parents = known[:, part.above]  # [B, P, depth+1, H]: the paths of the parents drafted from
        expanded = hidden[:, None].expand(-1, parents.shape[1], -1)  # [B, P, H]
        logits = self.heads(expanded, self.lm_head_weight, num_heads=depth + 1, known=parents,
                            first=depth)[:, :, 0]  # [B, P, V']
        values, indices = self.heads.backend.top_k(logits, part.top, log_probs=True)  # [B, P, r] log-probabilities
        drafted = self.heads.to_token_ids(indices[:, part.slot, part.rank])  # [B, n']
        own = values[:, part.slot, part.rank].clamp(max=0)
        path = above_logp[:, part.above][:, part.slot] + own  # [B, n']
        return drafted, path, torch.cat([parents[:, part.slot], self.embed(drafted)[:, :, None]], 2)
