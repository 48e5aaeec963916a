"""Shared tree drafting (specdec.drafters.trees) on hand-made candidates, no model: plans from paths, pruning
by path confidence, and the lookup branch merged into a tree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.drafters.ngram import lookup
from specdec.drafters.trees.dynamic import confident, confident_prefix, kept_nodes, open_part, path_logprobs
from specdec.drafters.trees.lookup_branch import add_branch, branch_first, continuations, merge_trie
from specdec.drafters.trees.plan import PlanCache, TreeCache, check_paths, plan_tree
from specdec.verify.tree import Tree

# rank 1 before rank 0 at the top, so node order and rank order differ
PATHS = [[1], [0], [2], [1, 0], [0, 0], [0, 1], [2, 0], [1, 0, 0], [0, 0, 0], [0, 0, 1]]
PARENTS = [-1, -1, -1, 0, 1, 1, 2, 3, 4, 4]


# --- plans ---------------------------------------------------------------------------------------------------


def test_check_paths_returns_plain_lists_and_names_bad_paths():
    assert check_paths(np.array([[0], [1]]), 2) == [[0], [1]] and check_paths([(0,), (0, 3)], 2) == [[0], [0, 3]]
    for paths, match in [([[0, 1], [0]], "listed before its parent"), ([[0], [0]], "repeated"),
                         ([[0], [0, 0], [0, 0, 0]], r"1..2 non-negative ranks"), ([[-1]], "non-negative"),
                         ([[]], "non-negative")]:
        with pytest.raises(ValueError, match=match):
            check_paths(paths, 2)


def test_plan_lays_the_paths_out_by_level():
    plan = plan_tree(PATHS, "cpu")
    assert plan.tree.parent_list == tuple(PARENTS)
    assert plan.level.tolist() == [len(p) - 1 for p in PATHS] and plan.rank.tolist() == [p[-1] for p in PATHS]
    assert plan.top == 3
    expected = [  # nodes, above (positions in the level above), slot, rank, top
        ([0, 1, 2], [0], [0, 0, 0], [1, 0, 2], 3),
        ([3, 4, 5, 6], [0, 1, 2], [0, 1, 1, 2], [0, 0, 1, 0], 2),
        ([7, 8, 9], [0, 1], [0, 1, 1], [0, 0, 1], 2),
    ]
    got = [(lv.nodes.tolist(), lv.above.tolist(), lv.slot.tolist(), lv.rank.tolist(), lv.top) for lv in plan.levels]
    assert got == expected


@pytest.mark.parametrize("paths", [PATHS, [[0], [0, 0], [1], [0, 1], [0, 0, 0], [1, 0]]])
def test_levels_give_every_node_its_parent_and_rank(paths):
    """Node n, drafted as candidate rank[i] of parent above[slot[i]], is the path's node: its parent and rank."""
    plan = plan_tree(paths, "cpu")
    previous = torch.tensor([-1])  # the root
    for level in plan.levels:
        parents = previous[level.above[level.slot]]
        for node, parent, rank in zip(level.nodes.tolist(), parents.tolist(), level.rank.tolist()):
            assert parent == plan.tree.parent_list[node] and rank == paths[node][-1]
        assert level.top == 1 + int(level.rank.max())
        previous = level.nodes


def test_level_part_and_spread():
    level = plan_tree(PATHS, "cpu").levels[1]  # nodes 3 4 5 6 under the level above's positions 0 1 2
    part = level.part(torch.tensor([False, True, True]))  # position 0 (node 0) closed
    assert (part.nodes.tolist(), part.above.tolist(), part.slot.tolist(), part.rank.tolist(), part.top) == (
        [4, 5, 6], [1, 2], [0, 0, 1], [0, 1, 0], 2)
    values = torch.tensor([[[40.0], [50.0], [60.0]]])  # [1, 3, 1]: one per node of the part
    assert level.spread(values, part, -1.0).tolist() == [[[-1.0], [40.0], [50.0], [60.0]]]


def test_plan_cache_builds_each_sub_tree_once():
    plans = PlanCache(PATHS)
    full = plans.get(tuple(range(len(PATHS))), "cpu")
    assert plans.get(tuple(range(len(PATHS))), "cpu") is full
    sub = plans.get((1, 4, 8), "cpu")  # [0], [0, 0], [0, 0, 0]
    assert sub.tree.parent_list == (-1, 0, 1) and sub.rank.tolist() == [0, 0, 0]


def test_tree_cache_keeps_at_most_its_size():
    trees = TreeCache(size=2)
    a = trees.get((-1, 0), "cpu")
    assert trees.get((-1, 0), "cpu") is a and a.parent_list == (-1, 0)
    trees.get((-1, -1), "cpu"), trees.get((-1,), "cpu")  # a third tree: the cache starts afresh
    assert trees.get((-1, 0), "cpu") is not a
    with pytest.raises(ValueError, match="size=0"):
        TreeCache(size=0)


# --- dynamic pruning -----------------------------------------------------------------------------------------


def test_path_logprobs_sum_each_nodes_ancestors():
    tree = Tree.from_parents(PARENTS)
    node_logp = -torch.rand(2, len(PARENTS), dtype=torch.float64)  # [B, N]
    node_logp[0, 4] = 1e-6  # round-off above 0 counts as 0
    expected = torch.zeros_like(node_logp)
    for n in range(len(PARENTS)):
        m = n
        while m >= 0:
            expected[:, n] += node_logp[:, m].clamp(max=0)
            m = PARENTS[m]
    torch.testing.assert_close(path_logprobs(node_logp, tree), expected, rtol=0, atol=1e-12)


def test_a_node_is_kept_by_its_confidence_averaged_over_the_rows():
    """Every kept node is verified in every row, so a node confident in one row of four is not worth it:
    the rule is the mean confidence (the any-row rule made the batch-4 tree on the real target ~4x wider)."""
    confidence = torch.tensor([[0.9, 0.5, 0.3], [1e-6, 0.5, 0.3], [1e-6, 0.5, 0.3], [1e-6, 0.5, 0.3]])  # [B, N]
    assert confident(confidence.log(), 0.25).tolist() == [False, True, True]  # node 0: mean 0.225
    assert confident(confidence[:1].log(), 0.25).tolist() == [True, True, True]  # batch 1: its own
    assert kept_nodes(confidence.log(), 0.25) == (1, 2) and kept_nodes(confidence.log(), 0.6) == ()


def test_kept_nodes_form_a_tree():
    torch.manual_seed(0)
    tree = Tree.from_parents(PARENTS)
    for threshold in (0.01, 0.05, 0.2, 0.5):
        kept = kept_nodes(path_logprobs(torch.randn(3, len(PARENTS)).log_softmax(-1), tree), threshold)
        assert all(PARENTS[n] in kept or PARENTS[n] == -1 for n in kept), (threshold, kept)


def test_open_part_drafts_below_confident_parents_only():
    level = plan_tree(PATHS, "cpu").levels[1]  # parents: nodes 0 1 2
    parent_logp = torch.tensor([[0.1, 0.5, 0.3], [0.1, 0.5, 0.1]]).log()  # [B, P]: mean 0.1 0.5 0.2
    assert open_part(level, parent_logp, 0.15).nodes.tolist() == [4, 5, 6]
    assert open_part(level, parent_logp, 0.05) is level  # all open: the level itself
    assert open_part(level, parent_logp, 0.6) is None


def chain_logits(rows: list[list[list[float]]]) -> torch.Tensor:  # probabilities [B, k, V] -> logits
    return torch.tensor(rows).log()


def test_confident_prefix_never_looks_at_the_draft_it_decides_on():
    # position 0: best 0.9; position 1: best 0.6; position 2: best 0.5
    logits = chain_logits([[[0.9, 0.1, 0.0], [0.6, 0.3, 0.1], [0.5, 0.25, 0.25]]])  # [1, 3, 3]
    # drafts 0, 0, 1: confidence 0.9, 0.9·0.6 = 0.54, 0.54·0.5 = 0.27 (not 0.54·0.25: its own draft is unseen)
    assert confident_prefix(logits, torch.tensor([[0, 0, 1]]), 0.25) == 3
    assert confident_prefix(logits, torch.tensor([[0, 0, 1]]), 0.3) == 2
    # an unlikely draft at position 0 costs the positions after it, not its own
    assert confident_prefix(logits, torch.tensor([[1, 0, 0]]), 0.5) == 1
    assert confident_prefix(logits, torch.tensor([[0, 0, 0]]), 0.95) == 0


def test_confident_prefix_keeps_the_longest_row():
    logits = chain_logits([[[0.9, 0.1], [0.5, 0.5]], [[0.6, 0.4], [0.9, 0.1]]])  # [2, 2, 2]
    assert confident_prefix(logits, torch.tensor([[0, 0], [1, 0]]), 0.4) == 2  # row 0 keeps 2, row 1 keeps 1
    assert confident_prefix(logits, torch.tensor([[1, 0], [1, 0]]), 0.4) == 1


# --- the lookup branch ---------------------------------------------------------------------------------------


def test_continuations_follow_the_ngram_lookup_and_skip_finished_rows():
    rows = [[7, 8, 9, 20, 21, 22, 23, 7, 8, 9], [1, 2, 3, 1, 2, 3], [4, 5, 6]]
    assert continuations(rows, [True, False, True], 3) == [[20, 21, 22], [], []]
    assert continuations(rows[1:2], [True], 8) == [lookup(np.array(rows[1]), 8, 3, 2).tolist()] == [[1, 2, 3]]


def siblings_repeat(row: list[int], parents: list[int]) -> bool:
    return len({(p, t) for p, t in zip(parents, row)}) < len(row)


def spelled(row: list[int], parents: list[int], chain: list[int]) -> int:
    """How many of ``chain``'s tokens are nodes down one path from the root."""
    node, found = -1, 0
    for token in chain:
        below = [i for i, p in enumerate(parents) if p == node and row[i] == token]
        if not below:
            break
        node, found = below[0], found + 1
    return found


def test_merge_trie_follows_the_nodes_that_hold_the_continuation():
    row, parents = [5, 6, 7, 6, 9], [-1, -1, 0, 0, 2]  # 5 -> {7 -> 9, 6}, 6
    new_row, new_parents = merge_trie(row, parents, [5, 7, 8, 1])
    assert new_row == row + [8, 1] and new_parents == parents + [2, 5]  # below 5 -> 7, then a new chain
    assert row == [5, 6, 7, 6, 9] and parents == [-1, -1, 0, 0, 2]  # the inputs are left alone
    assert not siblings_repeat(new_row, new_parents) and spelled(new_row, new_parents, [5, 7, 8, 1]) == 4
    assert merge_trie(row, parents, [6]) == (row, parents)  # all there: nothing added
    assert merge_trie([], [], [3, 4]) == ([3, 4], [-1, 0])  # no drafter nodes: the chain alone


def test_merge_trie_takes_the_first_of_equal_siblings():
    assert merge_trie([4, 4], [-1, -1], [4, 2]) == ([4, 4, 2], [-1, -1, 0])


def test_branch_first_hangs_the_rows_continuations_below_the_root_first():
    tokens = torch.tensor([[10, 11, 12], [30, 31, 32]])  # [2, 3]: a drafter's tree -1, 0, -1
    out, parents, filler = branch_first(tokens, [-1, 0, -1], [[20, 21, 22], [40]], fill=[9, 4])
    assert out.tolist() == [[20, 21, 22, 10, 11, 12], [40, 4, 4, 30, 31, 32]]  # row 1: filler, its last token
    assert parents == (-1, 0, 1, -1, 3, -1) and filler == [0, 2]


def test_add_branch_merges_at_batch_1_hangs_below_the_root_otherwise():
    tokens = torch.tensor([[5, 6, 7]])
    assert add_branch(tokens, (-1, -1, 0), [[]], [7])[1:] == ((-1, -1, 0), [0])  # nothing found: unchanged
    out, parents, filler = add_branch(tokens, (-1, -1, 0), [[5, 7, 3]], [7])
    assert out.tolist() == [[5, 6, 7, 3]] and parents == (-1, -1, 0, 2) and filler == [0]
    two = tokens.expand(2, -1)
    out, parents, filler = add_branch(two, (-1, -1, 0), [[5, 7], []], [1, 2])
    assert out.tolist() == [[5, 7, 5, 6, 7], [2, 2, 5, 6, 7]] and parents == (-1, 0, -1, -1, 2) and filler == [0, 2]
    out, parents, filler = add_branch(two[:, :0], (), [[8], [9]], [1, 2])  # no drafter nodes
    assert out.tolist() == [[8], [9]] and parents == (-1,) and filler == [0, 0]
    assert out.dtype == tokens.dtype
