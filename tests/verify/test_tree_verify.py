"""The tree verifier reproduces the target distribution exactly — and a planted bug is caught.

Statistical setup as in ``test_chain_verify.py``: a context-free "model" whose target and draft distributions
depend only on the output position t (cycling through M tables), so token t ~ P[t mod M] independently.
Many rows run the tree verifier in parallel over several steps; a chi-square goodness-of-fit test per
output position and on adjacent pairs, Holm-corrected, must not reject the exact rule and must reject the
planted bugs (no renormalisation after a rejected sibling; the tree versions of :mod:`specdec.exactness.planted`'s
verifier bugs). Then: tree geometry, greedy paths, the cache's
compaction, and greedy equality of tree drafting with plain decoding through the engine.
"""

from functools import partial

import numpy as np
import pytest
import torch

from specdec import autoregressive_generate, speculative_generate
from specdec.drafters.base import DecodeState, Drafter, Proposal
from specdec.exactness import planted
from specdec.exactness.stats import chi2_goodness_of_fit, holm
from specdec.jobs.data import left_pad
from specdec.models.cache import KVCache
from specdec.verify import Tree, greedy_tree, residual_after_rejection, verify_tree
from specdec.verify.tree import tree_draws, verify_tree_drawn
from specdec.verify.sampling import logits_to_probs, sample

V, M, LENGTH = 8, 3, 6
# Root with three children; the first has two, one of which has a child; the second has one.
PARENTS = [-1, -1, -1, 0, 0, 1, 3]


def no_renormalisation(p, q):
    """Planted bug: the next sibling is tested against max(0, p − q) without renormalising it."""
    return (p - q).clamp(min=0)


def _siblings(tree: Tree) -> list[list[int]]:
    return [[c - 1 for c in row if c > 0] for row in tree.children.tolist()]


def draft_tree(tree: Tree, q: torch.Tensor, mode: str, g: torch.Generator):
    """Node tokens [R, N] and their draft distributions [R, N, V] (None = deterministic) given each
    node's q [R, N, V]: "topk" (siblings = the best tokens of q, one-hot), "iid" (independent draws),
    "without_replacement" (each sibling drawn from q renormalised without its elder siblings' tokens)."""
    rows, n, _ = q.shape
    if mode == "iid":
        return sample(q, g), q
    tokens = torch.zeros(rows, n, dtype=torch.long)
    probs = q.clone()
    for kids in _siblings(tree):
        for j, node in enumerate(kids):
            if mode in ("topk", "repeated"):  # "repeated": a second sibling repeats the first's token (a lookup's)
                rank = 0 if mode == "repeated" and j == 1 else j
                tokens[:, node] = q[:, node].topk(rank + 1, dim=-1).indices[:, rank]
                continue
            for elder in kids[:j]:  # renormalised q without the elder siblings' tokens
                probs[:, node].scatter_(1, tokens[:, elder, None], 0.0)
            probs[:, node] /= probs[:, node].sum(-1, keepdim=True)
            tokens[:, node] = sample(probs[:, node], g)
    return tokens, None if mode in ("topk", "repeated") else probs


def simulate(mode, temperature, verify=verify_tree, rows=20000, seed=0, parents=PARENTS):
    """``verify``: a tree rule with :func:`verify_tree`'s signature."""
    g = torch.Generator().manual_seed(seed)
    target = logits_to_probs(torch.randn(M, V, generator=g) * 1.5, temperature)  # [M, V]
    draft = logits_to_probs(torch.randn(M, V, generator=g) * 1.5, temperature)  # [M, V]
    tree = Tree.from_parents(parents)
    depth = tree.max_depth
    out = torch.zeros(rows, LENGTH + depth + 1, dtype=torch.long)
    pos = torch.zeros(rows, dtype=torch.long)
    r = torch.arange(rows)
    while int(pos.min()) < LENGTH:
        # The node at depth d proposes output position pos + d - 1; p at block position of depth e is P[pos + e].
        node_q = draft[(pos[:, None] + tree.depths[None, 1:] - 1) % M]  # [R, N, V]
        target_probs = target[(pos[:, None] + tree.depths[None, :]) % M]  # [R, N+1, V]
        tokens, probs = draft_tree(tree, node_q, mode, g)
        nodes, n, nxt = verify(tree, tokens, probs, target_probs, g)
        emitted = torch.cat([tokens.gather(1, nodes.clamp(min=0)), nxt[:, None]], 1).scatter(1, n[:, None], nxt[:, None])
        for j in range(depth + 1):
            keep = j <= n
            out[r[keep], (pos + j)[keep].clamp(max=out.shape[1] - 1)] = emitted[keep, j]
        pos += n + 1
    return out[:, :LENGTH].numpy(), target.numpy()


def p_values(tokens, target):
    ps = [chi2_goodness_of_fit(tokens[:, t], target[t % M]).p_value for t in range(LENGTH)]
    for t in range(LENGTH - 1):  # adjacent pairs: catches dependence between positions
        pair = tokens[:, t] * V + tokens[:, t + 1]
        ps.append(chi2_goodness_of_fit(pair, np.outer(target[t % M], target[(t + 1) % M]).ravel()).p_value)
    return ps


def rejects(tokens, target, alpha=0.01) -> bool:
    return bool(holm(p_values(tokens, target), alpha)[1].any())


MODES = ["topk", "iid", "without_replacement"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_tree_rule_reproduces_target(mode, temperature):
    # A fixed seed per case, the same in every process (``hash`` of a str is salted per process, which
    # made this a fresh 1% draw on every run; the exact rule rejects at 5 of 600 seeds, i.e. nominal).
    tokens, target = simulate(mode, temperature, seed=10 * MODES.index(mode) + int(10 * temperature))
    assert not rejects(tokens, target)


def test_chain_shaped_tree_reproduces_target():
    tokens, target = simulate("iid", 1.0, parents=[-1, 0, 1], seed=3)
    assert not rejects(tokens, target)


@pytest.mark.parametrize("mode", ["topk", "iid"])
def test_planted_bug_no_renormalisation_is_caught(mode):
    tokens, target = simulate(mode, 1.0, verify=partial(verify_tree, residual=no_renormalisation), seed=5)
    assert rejects(tokens, target), f"missing renormalisation after a rejected sibling went undetected ({mode})"


@pytest.mark.parametrize("bug", sorted(planted.VERIFIER_BUGS))
@pytest.mark.parametrize("mode", ["topk", "iid"])
def test_planted_verifier_bugs_are_caught_in_trees(bug, mode):
    tokens, target = simulate(mode, 1.0, verify=planted.VERIFIER_BUGS[bug].tree, seed=6)
    assert rejects(tokens, target), f"planted bug {bug} went undetected in a tree ({mode})"


def drawn_first(tree, tokens, probs, target_probs, g):
    """:func:`verify_tree_drawn` (a graph's verdict) over uniforms drawn from ``g`` before it."""
    return verify_tree_drawn(tree, tokens, probs, target_probs,
                             torch.rand(tokens.shape[0], tree_draws(tree), generator=g, dtype=torch.float64))


@pytest.mark.parametrize("mode", MODES + ["repeated"])
def test_the_rule_over_uniforms_drawn_first_reproduces_target(mode):
    """The tree rule a graph runs (uniforms drawn before it; fixed candidates walked a level's siblings at once,
    drawn ones by the general walk) is exact too, a sibling repeating a token before it included."""
    tokens, target = simulate(mode, 1.0, verify=drawn_first, seed=20 + (MODES + ["repeated"]).index(mode))
    assert not rejects(tokens, target)


@pytest.mark.parametrize("bug", ["no renormalisation", "recovered from p", "a repeated token tried again"])
def test_planted_bugs_in_the_siblings_at_once_walk_are_caught(bug, monkeypatch):
    from specdec.verify import tree as module

    if bug == "no renormalisation":
        monkeypatch.setattr(module, "untried_mass", torch.ones_like)
    elif bug == "recovered from p":
        monkeypatch.setattr(module, "without_rejected", lambda p, tokens, rejected: p)
    else:  # its mass taken away twice, and the repeat accepted as if it were new
        monkeypatch.setattr(module, "repeated_tokens", lambda tokens, real: torch.zeros_like(real))
    tokens, target = simulate("repeated" if bug.startswith("a repeated") else "topk", 1.0, verify=drawn_first, seed=7)
    assert rejects(tokens, target), f"{bug} went undetected"


def on_the_kernel(tree, tokens, probs, target_probs, g, planted=None):
    """The sampled verdict's kernel (``gpu_kernels.sampled_verdict``, on a CUDA device) over uniforms drawn from ``g``
    before it, from logits log p at temperature 1; a chain-shaped tree as a chain (its drafts' q, where drawn, too)."""
    from specdec.models import gpu_kernels

    chain = all(parent == i - 1 for i, parent in enumerate(tree.parent_list))
    drawn = torch.rand(tokens.shape[0], tree_draws(tree), generator=g, dtype=torch.float64)
    block = torch.cat([torch.zeros_like(tokens[:, :1]), tokens], 1)
    accepted, next_tokens, _, path, _ = gpu_kernels.sampled_verdict(
        target_probs.log().cuda(), block.cuda(), drawn.cuda(), 1.0, None if chain else tree.children.cuda(),
        None if chain else tree.max_depth, draft_probs=None if probs is None else probs.float().cuda(),
        _planted=planted)
    nodes = (block[:, 1:2].new_tensor(range(tree.max_depth)).expand(len(block), -1) if chain
             else path[:, 1:].cpu() - 1)
    return nodes, accepted.cpu(), next_tokens.cpu()


@pytest.mark.gpu
@pytest.mark.parametrize("mode,parents", [("topk", PARENTS), ("repeated", PARENTS), ("topk", [-1, 0, 1]),
                                          ("iid", [-1, 0, 1]), ("iid", PARENTS), ("without_replacement", PARENTS)])
def test_the_sampled_verdict_kernel_reproduces_target(mode, parents):
    """The sampled verdict in one kernel (trees of fixed candidates, a sibling repeating a token before it, a chain of
    fixed drafts and one drawn from its q, trees drawn from their q with and without replacement: EAGLE's) leaves
    the target's distribution unchanged; its planted bugs (no
    renormalisation after a rejected sibling, the next token drawn from p) are caught. On a GPU only: under Triton's
    interpreter 20,000 rows take minutes (the default tier checks the kernel draws what the torch ops draw,
    tests/models/test_gpu_kernels.py)."""
    from specdec.models import gpu_kernels

    if not torch.cuda.is_available() or not gpu_kernels.available():
        pytest.skip("needs a CUDA device and Triton")
    tokens, target = simulate(mode, 1.0, verify=on_the_kernel, seed=30, parents=parents)
    assert not rejects(tokens, target)
    for planted in ("no_renormalisation", "recovered_from_p"):  # top_k_ignored: no top-k here (test_gpu_kernels')
        if planted == "no_renormalisation" and parents != PARENTS:
            continue  # one child a node: nothing to renormalise
        tokens, target = simulate(mode, 1.0, verify=partial(on_the_kernel, planted=planted), seed=31, parents=parents)
        assert rejects(tokens, target), f"{planted} went undetected on the kernel ({mode})"


def test_false_positive_rate_is_nominal():
    alpha, reps = 0.1, 30
    rejected = sum(rejects(*simulate("topk", 1.0, rows=3000, seed=100 + s), alpha=alpha) for s in range(reps))
    assert rejected <= 8  # binomial(30, 0.1): P(X > 8) < 0.001


# --- geometry and greedy ---------------------------------------------------------------------------------


def test_tree_geometry():
    tree = Tree.from_parents(PARENTS)
    assert tree.depths.tolist() == [0, 1, 1, 1, 2, 2, 2, 3]
    assert tree.children.tolist()[0] == [1, 2, 3] and tree.children.tolist()[1] == [4, 5, -1]
    # node 6 (block 7): itself, node 3 (block 4), node 0 (block 1), the root
    assert torch.nonzero(tree.mask[7]).flatten().tolist() == [0, 1, 4, 7]
    with pytest.raises(ValueError, match="parents must be listed first"):
        Tree.from_parents([-1, 2, 0])


def test_a_tree_built_on_the_device_is_the_tree_of_its_parents():
    """Tree.on_device (a drafter's shape chosen on the device, in ops of fixed shapes) gives from_parents' depths,
    mask and children (padded to the width asked for) on random trees, and the greedy walk goes down it alike."""
    g = torch.Generator().manual_seed(1)
    for trial in range(200):
        n = int(torch.randint(1, 14, (1,), generator=g))
        parents = [int(torch.randint(-1, i, (1,), generator=g)) for i in range(n)]
        host = Tree.from_parents(parents)
        width = host.children.shape[1] + trial % 3
        device = Tree.on_device(torch.tensor(parents), host.max_depth + trial % 2, width)
        assert device.parent_list == host.parent_list and device.known is None and int(device.levels) == host.max_depth
        assert torch.equal(device.depths, host.depths) and torch.equal(device.mask, host.mask)
        assert torch.equal(device.children[:, :host.children.shape[1]], host.children)
        assert (device.children[:, host.children.shape[1]:] == -1).all()
        tokens = torch.randint(0, 3, (4, n), generator=g)
        target = torch.rand(4, n + 1, 3, generator=g).softmax(-1)
        best = target.argmax(-1)
        for one, other in zip(greedy_tree(host, tokens, best), greedy_tree(device, tokens, best)):
            assert torch.equal(one, other[:, :one.shape[1]] if one.dim() == 2 else other)  # nodes: [B, a bound]


def test_greedy_follows_the_target_argmax_path():
    tree = Tree.from_parents(PARENTS)
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6, 7]])  # node tokens
    target = torch.zeros(1, 8, V)
    # root argmax 2 (node 1), at node 1 argmax 6 (node 5), at node 5 (a leaf) argmax 0 = bonus
    for block, best in [(0, 2), (1, 0), (2, 6), (3, 0), (4, 0), (5, 0), (6, 0), (7, 0)]:
        target[0, block, best] = 1.0
    nodes, n, nxt = verify_tree(tree, tokens, None, target)
    assert nodes.tolist() == [[1, 5, -1]] and n.tolist() == [2] and nxt.tolist() == [0]
    target[0, 0] = 0.0
    target[0, 0, 0] = 1.0  # root argmax is no candidate: recovered token, nothing accepted
    nodes, n, nxt = verify_tree(tree, tokens, None, target)
    assert n.tolist() == [0] and nxt.tolist() == [0]


def test_greedy_shortcut_equals_the_general_walk_on_one_hot_targets():
    """greedy_tree (the decode loop's path at temperature 0) gives the general rule's accepted nodes, count and
    next token on random trees, whatever q: small vocabularies make siblings share tokens (the first one
    wins) and paths run deep."""
    g = torch.Generator().manual_seed(0)
    for trial in range(300):
        n, vocab, batch = int(torch.randint(1, 12, (1,), generator=g)), int(torch.randint(2, 5, (1,), generator=g)), 5
        parents = [int(torch.randint(-1, i, (1,), generator=g)) for i in range(n)]
        tree = Tree.from_parents(parents)
        tokens = torch.randint(0, vocab, (batch, n), generator=g)
        best = torch.randint(0, vocab, (batch, n + 1), generator=g)
        target = torch.zeros(batch, n + 1, vocab).scatter_(-1, best[..., None], 1.0)
        q = None if trial % 2 else torch.rand(batch, n, vocab, generator=g).softmax(-1)
        expected = verify_tree(tree, tokens, q, target, torch.Generator().manual_seed(trial))
        got = greedy_tree(tree, tokens, best)
        for e, o in zip(expected, got):
            assert torch.equal(e, o), (parents, tokens, best)
    with pytest.raises(ValueError, match=r"tree of 7 nodes needs draft_tokens \[B, 7\] and target_tokens \[B, 8\]"):
        greedy_tree(Tree.from_parents(PARENTS), torch.zeros(1, 7, dtype=torch.long), torch.zeros(1, 7).long())


def test_shape_mismatch_is_named():
    with pytest.raises(ValueError, match=r"tree of 7 nodes"):
        verify_tree(Tree.from_parents(PARENTS), torch.zeros(1, 3, dtype=torch.long), None, torch.rand(1, 4, V))


# --- cache compaction --------------------------------------------------------------------------------------


@pytest.mark.parametrize("stacked", [True, False], ids=["one-tensor", "per-layer"])
def test_compact_gathers_the_accepted_path_into_contiguous_slots(stacked):
    cache = KVCache.allocate(2, 2, 1, 12, 1, torch.tensor([0, 2]), dtype=torch.float32, device=torch.device("cpu"))
    if not stacked:  # layers in tensors of their own (as a cache that grows them): compacted layer by layer
        cache = KVCache([k.clone() for k in cache.keys], [v.clone() for v in cache.values], cache.lengths, cache.pad)
    cache.commit(torch.tensor([3, 4]))
    for layer in range(2):
        new = (torch.arange(5, dtype=torch.float32) + 10 * (layer + 1))[None, None, :, None].repeat(2, 1, 1, 1)
        cache.write(layer, new, -new)  # 5 uncommitted tokens after each row's committed slots
    path = torch.tensor([[0, 2, 4], [0, 3, 1]])  # block offsets in accepted order
    cache.compact(path, torch.tensor([3, 2]))
    assert cache.lengths.tolist() == [6, 6]
    assert cache.keys[0][0, 0, 3:6, 0].tolist() == [10, 12, 14]
    assert cache.keys[1][1, 0, 4:6, 0].tolist() == [20, 23]
    assert cache.values[1][1, 0, 4:6, 0].tolist() == [-20, -23]


# --- through the engine ------------------------------------------------------------------------------------


class OracleTreeDrafter(Drafter):
    """Knows the greedy continuation; hides it along a random branch of ``PARENTS`` among wrong tokens,
    and sometimes only partly, so verification accepts paths of every length through every branch."""

    def __init__(self, reference: list[list[int]], prompt_lens: list[int], vocab: int, seed: int = 0):
        self.reference, self.prompt_lens, self.vocab = reference, prompt_lens, vocab
        self.tree = Tree.from_parents(PARENTS)
        self.rng = np.random.default_rng(seed)
        self.leaves = [i for i in range(len(PARENTS)) if i not in PARENTS]

    @classmethod
    def from_config(cls, cfg, target, tokenizer=None, backend=None):
        raise TypeError("built from a reference continuation, not a config")

    def observe(self, state: DecodeState) -> None:
        pass

    def propose(self, state: DecodeState, k: int) -> Proposal:
        rows = []
        for b, tokens in enumerate(state.tokens):
            done = len(tokens) - self.prompt_lens[b]  # tokens emitted so far; the next is reference[done]
            row = list(self.rng.integers(0, self.vocab, len(PARENTS)))
            node, path = int(self.rng.choice(self.leaves)), []
            while node >= 0:
                path.append(node)
                node = PARENTS[node]
            for depth, node in enumerate(list(reversed(path))[: len(path) - int(self.rng.integers(0, 2))]):
                if done + depth < len(self.reference[b]):
                    row[node] = self.reference[b][done + depth]
            rows.append(row)
        tokens = torch.tensor(rows, device=state.last_tokens.device)
        return Proposal(tokens=tokens, num_proposed=[len(PARENTS)] * len(rows), tree=self.tree)


def test_greedy_tree_decoding_equals_plain_decoding(tiny_target):
    ids, mask = left_pad([[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]])
    reference = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=40, eos_token_id=[])
    drafter = OracleTreeDrafter(reference.sequences, [7, 3], vocab=64)
    out = speculative_generate(tiny_target, drafter, ids, attention_mask=mask, k=len(PARENTS), max_new_tokens=40,
                               eos_token_id=[])
    assert out.sequences == reference.sequences
    assert out.stats.mean_accepted_length > 2.0  # long paths through the tree were accepted (and compacted)


def test_tree_decoding_stops_at_eos_inside_an_accepted_path(tiny_target):
    ids, mask = left_pad([[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]])
    free = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=30, eos_token_id=[])
    eos = free.sequences[0][9]  # a token the first row emits mid-way
    reference = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=30, eos_token_id=eos)
    drafter = OracleTreeDrafter(free.sequences, [7, 3], vocab=64, seed=1)
    out = speculative_generate(tiny_target, drafter, ids, attention_mask=mask, k=len(PARENTS), max_new_tokens=30,
                               eos_token_id=eos)
    assert out.sequences == reference.sequences


def test_residual_removes_the_rejected_mass_and_renormalises():
    p = torch.tensor([[0.5, 0.3, 0.2]])
    q = torch.tensor([[1.0, 0.0, 0.0]])  # a rejected fixed token
    assert torch.allclose(residual_after_rejection(p, q), torch.tensor([[0.0, 0.6, 0.4]]))
    assert torch.allclose(no_renormalisation(p, q), torch.tensor([[0.0, 0.3, 0.2]]))
    q = torch.tensor([[0.2, 0.5, 0.3]])  # a rejected draw from q
    assert torch.allclose(residual_after_rejection(p, q), torch.tensor([[1.0, 0.0, 0.0]]))
