"""Drafting strategies shared by the drafters that propose chains and token trees (Medusa's heads, the block
drafter's positions, an EAGLE-style layer).

- :mod:`~specdec.drafters.trees.drafting`: chains and trees drafted from per-position candidates
  (``ChainDrafting``, ``TreeDrafting``; ``IndependentHeads``: every position from the hidden state alone);
- :mod:`~specdec.drafters.trees.plan`: trees given as priority-ordered paths of candidate ranks, laid out
  for drafting (``check_paths``, ``plan_tree``, ``TreePlan``/``Level``, caches);
- :mod:`~specdec.drafters.trees.dynamic`: pruning trees and chains by path confidence (EAGLE-2's rule);
- :mod:`~specdec.drafters.trees.lookup_branch`: merging an n-gram lookup continuation into a tree;
- :mod:`~specdec.drafters.trees.siblings`: a node's children sampled without replacement, each reported with
  the law it was drawn from.

They take candidate tokens and log-probabilities, whatever model produced them, and never a model.
"""
