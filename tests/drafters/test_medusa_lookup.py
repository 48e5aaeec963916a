"""Medusa trees with a prompt-lookup branch, and drafting in another dtype: greedy equality with plain
decoding (batch 1, where the continuation is merged into the tree, and batch 2, where it hangs below the
root), the merge's structure (with a planted non-merging insert caught), exactness of sampling, and the
errors for settings that cannot work."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import PATHS, NoRenormalisation, markov_heads, markov_prompts, random_heads, sample_and_score

import specdec.drafters.trees.drafting
from specdec import autoregressive_generate, speculative_generate
from specdec.drafters import build_drafter
from specdec.drafters.medusa import MedusaDrafter
from specdec.exactness.stats import exactness_test
from specdec.jobs.data import left_pad
from specdec.verify import Tree
from specdec.verify.sampling import SamplingParams

# Prompts that repeat themselves, so the lookup finds continuations from the first step on.
REPEATING = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [12, 13, 14, 12, 13]]


def with_lookup_spy(drafter: MedusaDrafter) -> list[int]:
    """Record how many nodes the lookup adds at each step."""
    added, real = [], drafter.drafting.add_lookup

    def spy(state, tokens, tree):
        new_tokens, new_tree, filler = real(state, tokens, tree)
        added.append(new_tokens.shape[1] - tokens.shape[1])
        return new_tokens, new_tree, filler

    drafter.drafting.add_lookup = spy
    return added


@pytest.mark.parametrize("batch", [[REPEATING[0]], REPEATING], ids=["batch1-merged", "batch2-branch"])
@pytest.mark.parametrize("min_confidence, dtype", [(0.0, None), (0.05, None), (0.0, "bfloat16")],
                         ids=["fixed", "dynamic", "fixed-bf16"])
def test_greedy_medusa_with_lookup_equals_plain_decoding(tiny_target, batch, min_confidence, dtype):
    ids, mask = left_pad(batch)
    reference = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=30, eos_token_id=[])
    drafter = MedusaDrafter(random_heads(scale=1.0), tiny_target.lm_head.weight, PATHS, min_confidence,
                            lookup=4, dtype=dtype)
    added = with_lookup_spy(drafter)
    out = speculative_generate(tiny_target, drafter, ids, attention_mask=mask, k=10, max_new_tokens=30, eos_token_id=[])
    assert out.sequences == reference.sequences
    assert sum(added) > 0  # the branch was really there


def tree_problems(tokens: list[int], tree: Tree) -> list[str]:
    """Structural faults of a one-row tree: siblings that repeat a token (the second can never be accepted
    under greedy decoding and only costs verification)."""
    seen: dict[tuple[int, int], int] = {}
    problems = []
    for i, parent in enumerate(tree.parents.tolist()):
        if (parent, tokens[i]) in seen:
            problems.append(f"nodes {seen[parent, tokens[i]]} and {i} under {parent} both hold {tokens[i]}")
        seen.setdefault((parent, tokens[i]), i)
    return problems


def path_of(tokens: list[int], tree: Tree, chain: list[int]) -> list[int]:
    """The nodes that spell ``chain`` from the root down (shorter when it is not all there)."""
    parents, node, nodes = tree.parents.tolist(), -1, []
    for token in chain:
        below = [i for i, p in enumerate(parents) if p == node and tokens[i] == token]
        if not below:
            break
        node = below[0]
        nodes.append(node)
    return nodes


def append_without_merging(tokens, parents, found, fill):
    """Planted bug: at batch 1 the continuation is appended as a separate chain below the root, even where
    Medusa nodes already hold its first tokens."""
    n, chain = tokens.shape[1], found[0]
    parents = tuple(parents) + (-1,) + tuple(n + j for j in range(len(chain) - 1))
    return torch.cat([tokens, torch.tensor([chain])], 1), parents, [0]


@pytest.mark.parametrize("planted, merged", [(False, True), (True, False)], ids=["merge", "planted-append"])
def test_lookup_continuation_is_merged_like_a_trie(tiny_target, monkeypatch, planted, merged):
    if planted:
        monkeypatch.setattr(specdec.drafters.trees.drafting, "add_branch", append_without_merging)
    heads = random_heads(scale=1.0)
    hidden = torch.randn(1, 32)
    state = type("S", (), {})()  # the fields propose() reads
    state.last_hidden, state.sampling, state.active = hidden, SamplingParams(), [True]
    plain = MedusaDrafter(heads, tiny_target.lm_head.weight, PATHS)
    state.last_tokens, state.tokens = torch.tensor([9]), [[7, 8, 9]]
    medusa = plain.propose(state, len(PATHS))
    m0, m00 = medusa.tokens[0, 0].item(), medusa.tokens[0, 2].item()  # the nodes of paths [0] and [0, 0]
    # the text so far ends in 7 8 9, which earlier went on with m0 m00 50 51: that is the continuation
    state.tokens = [[7, 8, 9, m0, m00, 50, 51, 1, 7, 8, 9]]
    drafter = MedusaDrafter(heads, tiny_target.lm_head.weight, PATHS, lookup=4)
    proposal = drafter.propose(state, len(PATHS) + 4)
    tokens = proposal.tokens[0].tolist()
    assert tokens[: len(PATHS)] == medusa.tokens[0].tolist()  # the Medusa tree is kept as it was
    problems = tree_problems(tokens, proposal.tree)
    if merged:
        assert not problems, problems
        assert len(path_of(tokens, proposal.tree, [m0, m00, 50, 51])) == 4  # the continuation is all there
        assert proposal.tree.num_nodes == len(PATHS) + 2  # m0 and m00 were already there
    else:
        assert problems  # the check catches the planted bug


def test_batch_rows_hang_their_continuations_below_the_root_first(tiny_target):
    state = type("S", (), {})()
    state.last_hidden, state.sampling = torch.randn(2, 32), SamplingParams()
    state.last_tokens, state.active = torch.tensor([9, 4]), [True, True]
    state.tokens = [[7, 8, 9, 20, 21, 22, 7, 8, 9], [1, 2, 3, 4]]  # row 1 finds no continuation
    drafter = MedusaDrafter(random_heads(), tiny_target.lm_head.weight, PATHS, lookup=3)
    proposal = drafter.propose(state, len(PATHS) + 3)
    assert proposal.tree.parents.tolist()[:3] == [-1, 0, 1]  # the branch first, so it is tried first
    assert proposal.tokens[:, :3].tolist() == [[20, 21, 22], [4, 4, 4]]  # row 1: filler (its last token)
    assert proposal.tokens.shape[1] == len(PATHS) + 3
    assert proposal.num_proposed == [len(PATHS) + 3, len(PATHS)]  # filler is not counted as proposed


# --- exact sampling through the engine ---------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 400], ids=["batch1-merged", "batch400-branch"])
def test_sampling_with_a_lookup_branch_is_exact(markov_target, batch):
    drafter = MedusaDrafter(markov_heads(), markov_target.lm_head.weight, PATHS, lookup=4)
    added = with_lookup_spy(drafter)
    tokens, probs, positions, stats = sample_and_score(markov_target, drafter, rows=200 if batch == 1 else 400,
                                                       prompts=markov_prompts, batch=batch)
    assert sum(added) > 0 and stats.mean_accepted_length > 1.5  # the branch is there and drafts are accepted
    verdict = exactness_test(probs, tokens, rng=np.random.default_rng(0), alpha=0.01, positions=positions)
    assert not verdict.reject, verdict


def test_planted_tree_sampler_bug_is_caught_with_a_lookup_branch(markov_target):
    """No renormalisation after a rejected sibling: the test above rejects it with the branch in the tree."""
    drafter = MedusaDrafter(markov_heads(), markov_target.lm_head.weight, PATHS, lookup=4)
    tokens, probs, positions, _ = sample_and_score(markov_target, drafter, prompts=markov_prompts,
                                                   rule=NoRenormalisation())
    verdict = exactness_test(probs, tokens, rng=np.random.default_rng(0), alpha=0.01, positions=positions)
    assert verdict.reject, verdict


def test_bf16_chain_reports_the_float32_q_it_draws_from_and_stays_exact(markov_target):
    heads = markov_heads()
    drafter = MedusaDrafter(heads, markov_target.lm_head.weight, None, dtype="bfloat16")
    assert next(heads.parameters()).dtype == torch.float32  # the caller's heads are not cast in place
    assert drafter.lm_head_weight.dtype == torch.bfloat16
    tokens, probs, positions, stats = sample_and_score(markov_target, drafter)
    assert stats.mean_accepted_length > 1.3
    verdict = exactness_test(probs, tokens, rng=np.random.default_rng(0), alpha=0.01, positions=positions)
    assert not verdict.reject, verdict


# --- settings that cannot work -----------------------------------------------------------------------------


def test_bad_lookup_settings_are_named(tiny_target):
    weight = tiny_target.lm_head.weight
    with pytest.raises(ValueError, match="lookup=2: the prompt-lookup branch joins a tree"):
        MedusaDrafter(random_heads(), weight, None, lookup=2)
    with pytest.raises(ValueError, match="integer >= 0, got -1"):
        MedusaDrafter(random_heads(), weight, PATHS, lookup=-1)
    with pytest.raises(ValueError, match="unsupported dtype 'bf16'"):
        MedusaDrafter(random_heads(), weight, PATHS, dtype="bf16")
    with pytest.raises(ValueError, match="k=4 tree nodes, 4 of them for the prompt-lookup branch"):
        speculative_generate(tiny_target, MedusaDrafter(random_heads(), weight, PATHS, lookup=4),
                             torch.tensor([[5, 6, 7]]), k=4, max_new_tokens=4)
    with pytest.raises(ValueError, match=r"k=13 tree nodes requested \(4 for the prompt-lookup branch\)"):
        speculative_generate(tiny_target, MedusaDrafter(random_heads(), weight, PATHS, lookup=4),
                             torch.tensor([[5, 6, 7]]), k=13, max_new_tokens=4)
    cfg = MedusaDrafter.Config(k=4, lookup=4)
    with pytest.raises(ValueError, match="drafter.lookup=4 prompt-lookup nodes leave none of drafter.k=4"):
        build_drafter(cfg, tiny_target)


@pytest.mark.parametrize("bf16_cpu, target_dtype, expected", [(True, torch.float32, torch.bfloat16),
                                                              (False, torch.float32, torch.float32),
                                                              (True, torch.float16, torch.float16)])
def test_auto_dtype_drafts_in_bf16_only_where_it_is_fast(tiny_target, monkeypatch, bf16_cpu, target_dtype, expected):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16_cpu, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    weight = tiny_target.lm_head.weight.detach().to(target_dtype)
    drafter = MedusaDrafter(random_heads(), weight, PATHS, dtype="auto")
    assert drafter.dtype == expected and drafter.lm_head_weight.dtype == expected
    assert next(drafter.heads.parameters()).dtype == expected
    assert MedusaDrafter(random_heads(), weight, PATHS).dtype == target_dtype  # None: the target's


# --- the lookup branch found on the device (a GPU's way) --------------------------------------------------------


def test_the_device_lookup_finds_what_the_host_lookup_finds():
    """ngram.device_continuations, fixed shapes and nothing read back, against the n-gram rule row by row
    (left padding, rows too short for a suffix, no match, a continuation cut by the row's end), the rest filled with
    the row's last token; a planted lookup that reads the left padding as the row's tokens fails."""
    from specdec.drafters.ngram import device_continuations
    from specdec.drafters.trees import lookup_branch
    from specdec.drafters.trees.lookup_branch import continuations

    g = torch.Generator().manual_seed(0)

    def agree(find) -> bool:
        for trial in range(200):
            lens = torch.randint(2, 30, (3,), generator=g)
            pads = torch.stack([torch.randint(0, int(40 - n) + 1, (1,), generator=g)[0] for n in lens])
            seq, rows = torch.zeros(3, 40, dtype=torch.long), []
            for b in range(3):
                row = torch.randint(0, 4 if trial % 2 else 7, (int(lens[b]),), generator=g)
                seq[b, pads[b]: pads[b] + lens[b]] = row
                rows.append(row.tolist())
            tokens, found = find(seq, pads + lens, pads, 5)
            for b, chain in enumerate(continuations(rows, [True] * 3, 5)):
                if (int(found[b]), tokens[b, :len(chain)].tolist()) != (len(chain), chain) or \
                        any(t != rows[b][-1] for t in tokens[b, len(chain):].tolist()):
                    return False
        return True

    assert agree(device_continuations)

    def padding_read(seq, seq_lens, pad, width):  # planted: the left padding read as the row's tokens
        return device_continuations(seq, seq_lens, torch.zeros_like(pad), width)

    assert not agree(padding_read)
    assert lookup_branch.below_branch((-1, 0), 2) == (-1, 0, -1, 2)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "emulated_graphs"])
@pytest.mark.parametrize("batch", [[REPEATING[0]], REPEATING], ids=["batch1", "batch2"])
def test_greedy_medusa_with_the_device_lookup_equals_plain_decoding(tiny_target, batch, graphs, monkeypatch):
    """A fixed tree with the lookup branch found on the device (lookup_on_device, a GPU's default) drafts from the
    device alone: greedy output equals plain decoding, read a step late as each step read, and the branch is there
    (a fixed chain of L nodes before the heads' tree); with graphs (emulated here) the heads' tree and the lookup
    each replay one."""
    from helpers import read_late_and_each_step

    from specdec.models import Backend

    ids, mask = left_pad(batch)
    reference = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=30, eos_token_id=[])
    drafter = MedusaDrafter(random_heads(scale=1.0), tiny_target.lm_head.weight, PATHS, lookup=4,
                            lookup_on_device=True, backend=Backend.emulated_gpu() if graphs else Backend())
    drafter.runtime.replay_graphs("auto")
    assert drafter.traits.device_only and (drafter.runtime.graphs is not None) == graphs
    assert not MedusaDrafter(random_heads(), tiny_target.lm_head.weight, PATHS, 0.05, lookup=4,
                             lookup_on_device=True).traits.device_only  # a dynamic tree reads its nodes on the host
    widths = []
    real = drafter.drafting.add_device_lookup

    def spy(state, tokens, tree):
        out = real(state, tokens, tree)
        widths.append(out[0].shape[1] - tokens.shape[1])
        return out

    drafter.drafting.add_device_lookup = spy
    each_step, read_late = read_late_and_each_step(monkeypatch, tiny_target, drafter, ids, mask, 12, [],
                                                   max_new_tokens=30)
    assert each_step == read_late and each_step[0] == reference.sequences
    assert widths and set(widths) == {4} and each_step[1][4] > 0  # the branch, and drafts accepted
    if graphs:  # the heads' tree and the lookup: a graph each, captured once, replayed every step
        assert drafter.runtime.graphs.captures == 2 and drafter.runtime.graphs.replays >= 2 * len(widths)


def test_sampling_with_the_device_lookup_is_exact(markov_target):
    drafter = MedusaDrafter(markov_heads(), markov_target.lm_head.weight, PATHS, lookup=4, lookup_on_device=True)
    tokens, probs, positions, stats = sample_and_score(markov_target, drafter, rows=200, prompts=markov_prompts,
                                                       batch=200)
    assert stats.mean_accepted_length > 1.5
    verdict = exactness_test(probs, tokens, rng=np.random.default_rng(0), alpha=0.01, positions=positions)
    assert not verdict.reject, verdict
