"""Medusa's typical acceptance (specdec.verify.lossy.typical): a LOSSY rule, offered only as an explicit option.

What must hold: it is never the default; a drafter using it says it is lossy (and results carry that);
greedy output stays identical to plain decoding; and at temperature 1 the exactness test *rejects* it,
i.e. the statistical test has the power to see what the rule costs.
"""

import numpy as np
import pytest
import torch
from helpers import PATHS, markov_heads, random_heads, sample_and_score

from specdec import autoregressive_generate, speculative_generate
from specdec.drafters.medusa import MedusaDrafter
from specdec.exactness.stats import exactness_test
from specdec.jobs.data import left_pad
from specdec.verify import Tree
from specdec.verify.lossy.typical import TypicalAcceptance

UNIFORM = [0.2] * 5


def test_threshold_and_longest_path_by_hand():
    # node 0 (token 1) and node 1 (token 2) below the root; node 2 below node 0; node 3 below node 2
    tree = Tree.from_parents([-1, -1, 0, 2])
    p = torch.tensor([[[0.05, 0.6, 0.3, 0.03, 0.02],  # root: entropy 0.99, threshold min(0.09, 0.11) = 0.09
                       [0.9, 0.05, 0.03, 0.01, 0.01],  # after node 0: threshold 0.09
                       UNIFORM, [0.1, 0.1, 0.1, 0.6, 0.1],  # after node 2: threshold 0.3·e^-1.23 = 0.088
                       UNIFORM]])
    rule = TypicalAcceptance()
    assert rule.passes(p[0], torch.tensor([1, 0, 4, 3, 0])).tolist() == [True, True, True, True, True]
    assert rule.passes(p[0, :2], torch.tensor([4, 2])).tolist() == [False, False]  # 0.02 and 0.03 < 0.09
    g = torch.Generator().manual_seed(0)
    nodes, n, _ = rule.tree(tree, torch.tensor([[1, 2, 0, 4]]), None, p, g)  # 1 -> 0 -> 4: three deep
    assert nodes.tolist() == [[0, 2, 3]] and n.tolist() == [3]
    nodes, n, _ = rule.tree(tree, torch.tensor([[1, 2, 3, 4]]), None, p, g)  # node 2's token 3: 0.01, fails
    assert nodes.tolist() == [[0, -1, -1]] and n.tolist() == [1]  # tie at depth 1: token 1 (0.6) beats 2 (0.3)
    n, _ = rule.chain(torch.tensor([[1, 3]]), None, p[:, :3], g)
    assert n.tolist() == [1]


@pytest.mark.parametrize("paths", [PATHS, None], ids=["tree", "chain"])
@pytest.mark.parametrize("min_confidence", [0.0, 0.03])
def test_greedy_typical_acceptance_equals_plain_decoding(tiny_target, paths, min_confidence):
    """At temperature 0 the target's p is one-hot: only its argmax passes, so greedy output is unchanged."""
    ids, mask = left_pad([[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]])
    reference = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=30, eos_token_id=[])
    runs = {}
    for acceptance in ("exact", "typical"):
        drafter = MedusaDrafter(random_heads(scale=1.0), tiny_target.lm_head.weight, paths, min_confidence,
                                acceptance=acceptance)
        runs[acceptance] = speculative_generate(tiny_target, drafter, ids, attention_mask=mask, k=8 if paths else 3,
                                                max_new_tokens=30, eos_token_id=[])
    assert runs["typical"].sequences == reference.sequences
    assert runs["typical"].stats.accepted_per_position == runs["exact"].stats.accepted_per_position
    assert runs["typical"].stats.accepted_tokens > 0 or paths is None  # random heads: no chain draft is right


@pytest.mark.parametrize("paths", [PATHS, None], ids=["tree", "chain"])
def test_typical_acceptance_at_temperature_1_is_rejected_by_the_exactness_test(markov_target, paths):
    """The same drafter and test pass with the exact rule (tests/drafters/test_medusa.py); typical acceptance keeps
    every plausible draft, so the heads' choices leak into the output and the test must see it."""
    drafter = MedusaDrafter(markov_heads(), markov_target.lm_head.weight, paths, acceptance="typical")
    tokens, probs, positions, _ = sample_and_score(markov_target, drafter, seed=1)
    verdict = exactness_test(probs, tokens, rng=np.random.default_rng(0), alpha=0.01, positions=positions)
    assert verdict.reject, verdict


def test_typical_acceptance_is_explicit_and_marked_lossy(tiny_target):
    weight = tiny_target.lm_head.weight
    assert MedusaDrafter.Config().acceptance == "exact"
    assert not MedusaDrafter(random_heads(), weight, PATHS).traits.lossy
    drafter = MedusaDrafter(random_heads(), weight, PATHS, acceptance=TypicalAcceptance(0.05, 0.2))
    assert drafter.traits.lossy and drafter.traits.acceptance == TypicalAcceptance(0.05, 0.2)
    with pytest.raises(ValueError, match="acceptance must be 'exact' or 'typical'.*'typcal'"):
        MedusaDrafter(random_heads(), weight, PATHS, acceptance="typcal")


@pytest.mark.parametrize("epsilon, alpha, name", [(0.0, 0.3, "epsilon"), (0.09, 1.5, "alpha"), (-1, 0.3, "epsilon")])
def test_bad_typical_thresholds_are_named(epsilon, alpha, name):
    with pytest.raises(ValueError, match=f"{name} must be in \\(0, 1\\]"):
        TypicalAcceptance(epsilon, alpha)
