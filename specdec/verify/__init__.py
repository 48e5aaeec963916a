"""Acceptance rules: which draft tokens the target keeps, and the token it emits after them.

Vocabulary, used the same way across specdec:

- **draft** tokens: the K tokens a drafter proposes for one target forward (a chain), or the N nodes of a
  draft tree, each drawn from the draft distribution q_i (or chosen deterministically: then q_i is one-hot
  on that token);
- **accepted**: the draft tokens the rule keeps: a prefix of a chain, a root-to-node path of a tree;
- **recovered** token: drawn after a rejection from the residual norm(max(0, p_i − q_i)) (in a tree, the
  residual left once every child of the last accepted node was rejected);
- **bonus** token: drawn from the target's p after the last draft when every draft of a chain (a path to
  a tree's leaf) was accepted;
- **emitted** tokens of one verify step: the accepted drafts, then one recovered or bonus token;
- acceptance rate **α** = accepted draft tokens / proposed draft tokens;
- mean accepted length **τ** = tokens emitted per target forward, *bonus included* (so τ ≥ 1);
- cost ratio **c** = time of one drafter step / time of one target step, measured.

The exact rule (:mod:`specdec.verify.chain` for chains, :mod:`specdec.verify.tree` for trees) emits tokens
distributed exactly as sampling from the target alone, whatever q is, provided p and q went through the
same sampling processing (:func:`specdec.verify.sampling.logits_to_probs`). The decode loop calls one
:class:`~specdec.verify.rules.AcceptanceRule` object, :data:`EXACT` unless told otherwise; the lossy rule
(Medusa's typical acceptance) lives in :mod:`specdec.verify.lossy`, and planted bugs are rules too
(:mod:`specdec.exactness.planted`).

At temperature 0 the decode loop verifies under the exact rule from the target's argmax tokens alone
(:func:`greedy_chain`, :func:`greedy_tree`: the one-hot case without building [B, K+1, V] one-hot
distributions or walking the vocabulary per sibling; tested equal to the general rule's output).

Everything here is a pure function of probabilities (or argmax tokens) and a ``torch.Generator``; there is no
host sync.
"""

from specdec.verify.chain import accept_drafts, emitted_tokens, greedy_chain, next_token_probs, rejection_sample
from specdec.verify.rules import EXACT, AcceptanceRule, ExactRule
from specdec.verify.tree import Tree, accepted_path, greedy_tree, residual_after_rejection, verify_tree

__all__ = ["EXACT", "AcceptanceRule", "ExactRule", "Tree", "accept_drafts", "accepted_path", "emitted_tokens",
           "greedy_chain", "greedy_tree", "next_token_probs", "rejection_sample", "residual_after_rejection",
           "verify_tree"]
