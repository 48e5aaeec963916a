"""The verifier reproduces the target distribution exactly — and a planted bug is caught.

Setup: a context-free "model" whose target and draft distributions depend only on the output position
t (they cycle through M tables), so the exact law of every emitted token is known: token t ~ P[t mod M],
independent of the others. Many rows run the verifier in parallel over several steps; a chi-square
goodness-of-fit test per output position and on pairs of adjacent positions, Holm-corrected, must not
reject for the exact rule and must reject each planted bug.
"""

import numpy as np
import pytest
import torch

from specdec.exactness import planted
from specdec.exactness.stats import chi2_goodness_of_fit, holm
from specdec.verify import greedy_chain, rejection_sample
from specdec.verify.sampling import logits_to_probs, sample

V, M, LENGTH = 8, 3, 6


def simulate(verifier, k, temperature, top_k, top_p, rows=20000, seed=0, deterministic=False):
    g = torch.Generator().manual_seed(seed)
    target = logits_to_probs(torch.randn(M, V, generator=g) * 1.5, temperature, top_k, top_p)  # [M, V]
    draft = logits_to_probs(torch.randn(M, V, generator=g) * 1.5, temperature, top_k, top_p)  # [M, V]
    out = torch.zeros(rows, LENGTH + k + 1, dtype=torch.long)
    pos = torch.zeros(rows, dtype=torch.long)
    while int(pos.min()) < LENGTH:
        idx = (pos[:, None] + torch.arange(k + 1)) % M  # [N, K+1]
        q = draft[idx[:, :k]]  # [N, K, V]
        drafts = q.argmax(-1) if deterministic else sample(q, g)
        n, nxt = verifier(drafts, None if deterministic else q, target[idx], g)
        emitted = torch.cat([drafts, nxt[:, None]], 1).scatter(1, n[:, None], nxt[:, None])
        slots = (pos[:, None] + torch.arange(k + 1)).clamp(max=out.shape[1] - 1)
        keep = torch.arange(k + 1)[None] <= n[:, None]
        out.scatter_(1, torch.where(keep, slots, out.shape[1] - 1), torch.where(keep, emitted, 0))
        pos += n + 1
    return out[:, :LENGTH].numpy(), target.numpy()


def p_values(tokens, target):
    ps = [chi2_goodness_of_fit(tokens[:, t], target[t % M]).p_value for t in range(LENGTH)]
    for t in range(LENGTH - 1):  # joint of adjacent positions: catches dependence between them
        pair = tokens[:, t] * V + tokens[:, t + 1]
        ps.append(chi2_goodness_of_fit(pair, np.outer(target[t % M], target[(t + 1) % M]).ravel()).p_value)
    return ps


def rejects(tokens, target, alpha=0.01) -> bool:
    return bool(holm(p_values(tokens, target), alpha)[1].any())


SETTINGS = [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 5, 1.0), (0.7, 0, 0.8), (1.0, 6, 0.9)]


@pytest.mark.parametrize("temperature, top_k, top_p", SETTINGS)
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_exact_rule_reproduces_target(k, temperature, top_k, top_p):
    tokens, target = simulate(rejection_sample, k, temperature, top_k, top_p, seed=k)
    assert not rejects(tokens, target)


@pytest.mark.parametrize("k", [1, 3])
def test_exact_rule_with_deterministic_drafts(k):
    tokens, target = simulate(rejection_sample, k, 1.0, 0, 1.0, seed=10 + k, deterministic=True)
    assert not rejects(tokens, target)


@pytest.mark.parametrize("bug", sorted(planted.VERIFIER_BUGS))
@pytest.mark.parametrize("k", [1, 3])
def test_planted_verifier_bugs_are_caught(bug, k):
    tokens, target = simulate(planted.VERIFIER_BUGS[bug].chain, k, 1.0, 0, 1.0, seed=k)
    assert rejects(tokens, target), f"planted bug {bug} at k={k} went undetected"


def test_false_positive_rate_is_nominal():
    """Over repeated seeds the exact rule is rejected at about the nominal rate (here α = 0.1)."""
    alpha, reps = 0.1, 40
    rejected = sum(rejects(*simulate(rejection_sample, 2, 1.0, 0, 1.0, rows=3000, seed=100 + s), alpha=alpha)
                   for s in range(reps))
    assert rejected <= 10  # binomial(40, 0.1): P(X > 10) < 0.001


def test_greedy_accepts_exactly_the_argmax_prefix():
    target = torch.zeros(1, 4, 5)
    target[0, torch.arange(4), torch.tensor([1, 2, 3, 4])] = 1.0  # argmax tokens 1, 2, 3, then bonus 4
    n, nxt = rejection_sample(torch.tensor([[1, 2, 0]]), None, target)
    assert n.tolist() == [2] and nxt.tolist() == [3]  # third draft rejected: recovered = target argmax
    n, nxt = rejection_sample(torch.tensor([[1, 2, 3]]), None, target)
    assert n.tolist() == [3] and nxt.tolist() == [4]  # all accepted: bonus from p_K


def test_greedy_shortcut_equals_the_general_rule_on_one_hot_targets():
    """greedy_chain (the decode loop's path at temperature 0) gives rejection_sample's count and next token."""
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        k, vocab, batch = int(torch.randint(1, 7, (1,), generator=g)), int(torch.randint(2, 4, (1,), generator=g)), 6
        drafts = torch.randint(0, vocab, (batch, k), generator=g)
        best = torch.randint(0, vocab, (batch, k + 1), generator=g)
        target = torch.zeros(batch, k + 1, vocab).scatter_(-1, best[..., None], 1.0)
        q = None if trial % 2 else torch.rand(batch, k, vocab, generator=g).softmax(-1)
        for e, o in zip(rejection_sample(drafts, q, target, torch.Generator().manual_seed(trial)),
                        greedy_chain(drafts, best)):
            assert torch.equal(e, o), (drafts, best)
    with pytest.raises(ValueError, match=r"target_tokens must be \[B, K\+1\] = \[1, 4\]"):
        greedy_chain(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long))


def test_shape_mismatch_is_named():
    with pytest.raises(ValueError, match=r"target_probs must be \[B, K\+1, V\]"):
        rejection_sample(torch.zeros(1, 3, dtype=torch.long), None, torch.rand(1, 3, 5))
