"""Decode loop on tiny random models: greedy identity, EOS, max_new_tokens, determinism, stats, and the one
acceptance rule it verifies chains and trees with."""

import collections
import dataclasses

import numpy as np
import pytest
import torch
from helpers import OracleTreeDrafter, tiny_llama

from specdec import DraftModelDrafter, NgramDrafter, autoregressive_generate, speculative_generate
from specdec.drafters.base import Drafter, Proposal, Traits
from specdec.errors import VocabMismatchError
from specdec.jobs.data import left_pad
from specdec.verify import EXACT, Tree, rejection_sample
from specdec.verify.lossy.typical import TypicalAcceptance

PROMPTS = [[5, 9, 3, 7, 11, 2, 8, 5, 9, 3], [4, 4, 6], [12, 13, 14, 15, 12, 13]]


def drafters(tiny_target, tiny_draft):
    return {
        "ngram": NgramDrafter(),
        "ngram_on_device": NgramDrafter(on_device=True),
        "draft_model": DraftModelDrafter(tiny_draft),
        "early_exit": DraftModelDrafter(tiny_target, num_layers=1),
    }


def hf_greedy(model, ids, mask, n):
    out = model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, eos_token_id=None,
                         pad_token_id=0)
    return out[:, ids.shape[1]:].tolist()


@pytest.mark.parametrize("batch", [[PROMPTS[0]], PROMPTS])
def test_autoregressive_equals_transformers_generate(tiny_target, batch):
    ids, mask = left_pad(batch)
    out = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=40, eos_token_id=[])
    assert out.sequences == hf_greedy(tiny_target, ids, mask, 40)


@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("name", ["ngram", "draft_model", "early_exit"])
def test_greedy_speculative_equals_plain(tiny_target, tiny_draft, name, k):
    for batch in ([PROMPTS[0]], PROMPTS):
        ids, mask = left_pad(batch)
        ref = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=40, eos_token_id=[])
        drafter = drafters(tiny_target, tiny_draft)[name]
        out = speculative_generate(tiny_target, drafter, ids, attention_mask=mask, k=k, max_new_tokens=40,
                                   eos_token_id=[])
        assert out.sequences == ref.sequences
        assert all(len(s) == 40 for s in out.sequences)  # max_new_tokens exact


def test_eos_stops_a_row_inside_an_accepted_draft(tiny_target, tiny_draft):
    ids, mask = left_pad(PROMPTS)
    free = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=30, eos_token_id=[])
    eos = free.sequences[1][6]  # a token row 1 emits mid-generation
    ref = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=30, eos_token_id=eos)
    assert len(ref.sequences[1]) <= 7 and ref.sequences[1][-1] == eos
    # The early-exit drafter accepts long runs on this model, so EOS falls inside accepted drafts.
    out = speculative_generate(tiny_target, DraftModelDrafter(tiny_target, num_layers=2), ids, attention_mask=mask,
                               k=6, max_new_tokens=30, eos_token_id=eos)
    assert out.sequences == ref.sequences
    assert out.stats.mean_accepted_length > 2


def test_sampling_is_seeded_and_reproducible(tiny_target, tiny_draft):
    ids, mask = left_pad(PROMPTS)
    runs = [
        speculative_generate(tiny_target, DraftModelDrafter(tiny_draft), ids, attention_mask=mask, k=3,
                             max_new_tokens=25, temperature=0.8, top_p=0.9,
                             generator=torch.Generator().manual_seed(7), eos_token_id=[]).sequences
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_stats_are_consistent(tiny_target):
    ids, mask = left_pad(PROMPTS)
    out = speculative_generate(tiny_target, DraftModelDrafter(tiny_target, num_layers=2), ids, attention_mask=mask,
                               k=4, max_new_tokens=30, eos_token_id=[])
    s = out.stats
    assert s.new_tokens == sum(len(x) for x in out.sequences) == 90
    assert 0 <= s.acceptance_rate <= 1 and len(s.acceptance_per_position) == 4
    assert s.mean_accepted_length == pytest.approx(1 + s.accepted_tokens / s.verify_steps)
    assert s.proposed_per_position[0] == s.verify_steps  # position 0 is reached at every verify step
    assert s.drafter_forwards > 0 and s.target_forwards < 90
    # decode only: the prefill's time and the token it gave each row left out of the end-to-end figures
    assert s.prefill_tokens == 3 and 0 < s.prefill_time_s < s.wall_time_s and s.decode_time_s == pytest.approx(
        s.wall_time_s - s.prefill_time_s)
    assert s.decode_tokens_per_second == pytest.approx((90 - 3) / s.decode_time_s)
    assert s.merge(s).decode_tokens_per_second == pytest.approx(s.decode_tokens_per_second)


def test_merging_stats_sums_every_field():
    """merge() adds every count and time (per-position counts padded to the larger K): a field added to DecodeStats
    is summed without merge() naming it."""
    from dataclasses import fields

    from specdec.decode.metrics import DecodeStats

    a, b = DecodeStats(k=2), DecodeStats(k=3)
    for i, f in enumerate(f for f in fields(DecodeStats) if f.name != "k"):
        setattr(a, f.name, [i, i + 1] if f.name.endswith("_per_position") else i + 1)
        setattr(b, f.name, [1, 1, 1] if f.name.endswith("_per_position") else 10 * (i + 1))
    merged = a.merge(b)
    for i, f in enumerate(f for f in fields(DecodeStats) if f.name != "k"):
        expected = [i + 1, i + 2, 1] if f.name.endswith("_per_position") else 11 * (i + 1)
        assert getattr(merged, f.name) == expected, f.name
    assert merged.k == 3


# --- bad input: each names the value and what to do -------------------------------------------


@pytest.mark.parametrize("k", [0, -2, 1.5, True])
def test_bad_lookahead(tiny_target, k):
    with pytest.raises(ValueError, match=r"k \(lookahead.*must be an integer >= 1"):
        speculative_generate(tiny_target, NgramDrafter(), torch.tensor([[1, 2]]), k=k, max_new_tokens=4)


def test_bad_sampling_is_rejected_before_work(tiny_target):
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        speculative_generate(tiny_target, NgramDrafter(), torch.tensor([[1, 2]]), k=2, max_new_tokens=4,
                             temperature=-1.0)
    with pytest.raises(ValueError, match=r"top_p must lie in \(0, 1\]"):
        autoregressive_generate(tiny_target, torch.tensor([[1, 2]]), max_new_tokens=4, top_p=0)


def test_prompt_longer_than_context(tiny_target):
    with pytest.raises(ValueError, match=r"prompt \(600 tokens\).*exceeds the model's context of 512"):
        autoregressive_generate(tiny_target, torch.ones(1, 600, dtype=torch.long), max_new_tokens=8)


def test_right_padding_is_rejected(tiny_target):
    with pytest.raises(ValueError, match="left-padded"):
        autoregressive_generate(tiny_target, torch.tensor([[1, 2, 0], [3, 4, 5]]),
                                attention_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]), max_new_tokens=2)


def test_batch_without_mask_and_bad_max_new_tokens(tiny_target):
    with pytest.raises(ValueError, match="needs an attention_mask"):
        autoregressive_generate(tiny_target, torch.ones(2, 3, dtype=torch.long), max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
        autoregressive_generate(tiny_target, torch.ones(1, 3, dtype=torch.long), max_new_tokens=0)


def test_draft_vocabulary_mismatch(tiny_target):
    other = tiny_llama(vocab_size=80, seed=3)
    with pytest.raises(VocabMismatchError, match=r"draft model vocabulary \(80 tokens\) differs.*\(64\)"):
        speculative_generate(tiny_target, DraftModelDrafter(other), torch.tensor([[1, 2, 3]]), k=2, max_new_tokens=4)


def test_tree_levels_are_the_positions_of_per_position_acceptance():
    from specdec.decode.metrics import DecodeStats

    s = DecodeStats(k=8)  # 8 tree nodes on 3 levels
    s.record_step([8, 8], [3, 1], [True, True], depth=3)
    assert s.proposed_per_position == [2, 2, 1, 0, 0, 0, 0, 0]  # no level 4: never "reached", never a miss
    assert s.accepted_per_position[:3] == [2, 1, 1] and s.acceptance_per_position[:3] == [1.0, 0.5, 1.0]
    assert s.acceptance_rate == 4 / 16 and s.mean_accepted_length == 3.0


# --- the acceptance rule ---------------------------------------------------------------------------------


class FixedTreeDrafter(Drafter):
    """Proposes the same tree every step: tokens 5 and 9 below the root, token 3 below the 5."""

    tree = Tree.from_parents([-1, -1, 0])

    @classmethod
    def from_config(cls, cfg, target, tokenizer=None, backend=None):
        return cls()

    def propose(self, state, k):
        return Proposal(tokens=torch.tensor([[5, 9, 3]]).expand(len(state.active), 3), tree=self.tree)

    def observe(self, state):
        pass


class LossyTreeDrafter(FixedTreeDrafter):
    traits = Traits(acceptance=TypicalAcceptance())


class RecordingRule:
    """The exact rule, recording which proposal shapes it was asked to verify."""

    lossy = False

    def __init__(self):
        self.calls = []

    def chain(self, *args):
        self.calls.append("chain")
        return EXACT.chain(*args)

    def tree(self, *args):
        self.calls.append("tree")
        return EXACT.tree(*args)


@pytest.mark.parametrize("drafter, shape", [(NgramDrafter(), "chain"), (FixedTreeDrafter(), "tree")],
                         ids=["chain", "tree"])
def test_the_rule_verifies_chains_and_trees(tiny_target, drafter, shape):
    ids, mask = left_pad(PROMPTS)
    ref = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[])
    rule = RecordingRule()
    out = speculative_generate(tiny_target, drafter, ids, attention_mask=mask, k=3, max_new_tokens=12,
                               eos_token_id=[], rule=rule)
    assert rule.calls and set(rule.calls) == {shape}
    assert out.sequences == ref.sequences
    # what tells the run table whether Leviathan's chain formula applies
    assert out.stats.tree_steps == (out.stats.target_forwards if shape == "tree" else 0)


def test_an_explicit_rule_cannot_replace_a_lossy_drafters_own(tiny_target):
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="lossy acceptance rule TypicalAcceptance.*drafter.acceptance=exact"):
        speculative_generate(tiny_target, LossyTreeDrafter(), ids, k=3, max_new_tokens=4, rule=EXACT)
    out = speculative_generate(tiny_target, LossyTreeDrafter(), ids, k=3, max_new_tokens=4, eos_token_id=[])
    assert len(out.sequences[0]) == 4  # with no rule given, the drafter's own verifies
    with pytest.raises(TypeError, match="rule must be an acceptance rule.*function rejection_sample"):
        speculative_generate(tiny_target, NgramDrafter(), ids, k=3, max_new_tokens=4, rule=rejection_sample)


def _plain_runs(target, ids, mask, eos, **sampling):
    """Plain decoding's outputs and counts (a greedy or seeded run), the stats that do not depend on the clock."""
    out = autoregressive_generate(target, ids, attention_mask=mask, max_new_tokens=12, eos_token_id=eos, **sampling)
    stats = out.stats
    return out.sequences, (stats.target_forwards, stats.new_tokens, stats.verify_steps, stats.verified_tokens)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "emulated_graphs"])
def test_plain_decoding_read_a_step_late_equals_the_loop_that_reads_each_step(tiny_target, monkeypatch, graphs):
    """On a GPU plain decoding reads each step back after it has launched the next (engine._pipelined_steps, the kept
    counts worked out on the device): the same tokens and counts as the loop that reads every step before the next,
    with rows stopping at EOS at different steps, at max_new_tokens, and sampled from a seeded generator; a device
    count that misses an EOS (planted) is refused, not written into the cache silently."""
    from specdec.decode import engine
    from specdec.models import Backend, as_decoder
    from specdec.models.graphs import GraphedDecoder

    target = GraphedDecoder(as_decoder(tiny_target, backend=Backend.emulated_gpu())) if graphs else tiny_target
    ids, mask = left_pad(PROMPTS)
    free = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[])
    cases = [([], {}), ([free.sequences[1][4], free.sequences[2][8]], {}),  # rows 1 and 2 stop early, row 0 runs on
             ([free.sequences[0][0]], {}),  # a row that stops on its first token
             ([], {"temperature": 1.0})]
    for eos, sampling in cases:
        seeded = (lambda: {"generator": torch.Generator().manual_seed(3)}) if sampling else dict
        monkeypatch.setattr(engine, "PIPELINED_DEVICES", ())
        reference = _plain_runs(target, ids, mask, eos, **sampling, **seeded())
        monkeypatch.setattr(engine, "PIPELINED_DEVICES", ("cpu",))
        assert _plain_runs(target, ids, mask, eos, **sampling, **seeded()) == reference
    assert len(reference[0][1]) == 12 and len(_plain_runs(tiny_target, ids, mask, cases[1][0])[0][1]) < 12

    def missed_eos(step, live, left, eos):  # the planted bug: a row keeps decoding past its EOS on the device
        count = live.long()
        left -= count
        live &= left > 0
        return count

    monkeypatch.setattr(engine, "_plain_counts", missed_eos)
    with pytest.raises(RuntimeError, match="device-side counts"):
        _plain_runs(target, ids, mask, cases[1][0])


def _ops_outside_replays(monkeypatch, generate) -> collections.Counter:
    """The ops ``generate()`` dispatches outside emulated graphs' replays that launch a kernel (no views, nothing
    empty), by name."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from specdec.models.graphs import EmulatedGraph

    class Outside(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.counts, self.inside = collections.Counter(), 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            launches = not func.is_view and not (isinstance(out, torch.Tensor) and out.numel() == 0)
            self.counts[func.overloadpacket.__name__] += not self.inside and launches
            return out

    mode, replay = Outside(), EmulatedGraph.replay

    def replaying(graph):
        mode.inside += 1
        try:
            return replay(graph)
        finally:
            mode.inside -= 1

    monkeypatch.setattr(EmulatedGraph, "replay", replaying)
    with torch.no_grad(), mode:
        generate()
    monkeypatch.setattr(EmulatedGraph, "replay", replay)
    return mode.counts


def test_a_plain_step_read_late_on_graphs_is_one_replay_and_two_copies(tiny_target, monkeypatch):
    """On a GPU a plain step (the forward, the argmax, the kept counts, the commit: engine._DeviceCommit in the
    verification's graph) is one graph replay, so the host launches only the copies of the last token in and of the
    step's rows out: per step, the difference between generations of 24 and 8 new tokens on emulated graphs over 16
    steps. Planted: the commit run after the replay (the loop's shape before), 19 a step."""
    from specdec.decode import engine
    from specdec.models import Backend, as_decoder
    from specdec.models.graphs import GraphedDecoder

    target = GraphedDecoder(as_decoder(tiny_target, backend=Backend.emulated_gpu()))
    ids, mask = left_pad(PROMPTS)
    monkeypatch.setattr(engine, "PIPELINED_DEVICES", ("cpu",))

    def per_step() -> collections.Counter:
        run = {n: (lambda n=n: autoregressive_generate(target, ids, attention_mask=mask, max_new_tokens=n,
                                                       eos_token_id=[])) for n in (8, 24)}
        run[8]()  # captured
        counts = {n: _ops_outside_replays(monkeypatch, generate) for n, generate in run.items()}
        return collections.Counter({op: (counts[24][op] - counts[8][op]) / 16 for op in counts[24]
                                    if counts[24][op] != counts[8][op]})

    assert per_step() == {"copy_": 2}
    replayed = engine._replayed

    def committed_after(decoder, then, step_of, key, ids, cache, tree, commit, **forward):
        step = replayed(decoder, then, step_of, key, ids, cache, tree, None, **forward)
        return dataclasses.replace(step, committed=commit(step))

    monkeypatch.setattr(engine, "_replayed", committed_after)
    assert sum(per_step().values()) > 15


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "emulated_graphs"])
@pytest.mark.parametrize("tree", [True, False], ids=["fixed_tree", "chain"])
def test_a_device_only_drafter_read_a_step_late_equals_the_loop_that_reads_each_step(tiny_target, monkeypatch,
                                                                                   graphs, tree):
    """A drafter that proposes from the device's state alone (Medusa's fixed tree or chain without the lookup
    branch: ``traits.device_only``) is read back a step late on a GPU (engine._pipelined_steps, the kept counts
    worked out on the device with accepted drafts, EOS inside them and max_new_tokens): the same tokens and counts as
    the loop that reads each step, greedy and sampled; a device count that keeps tokens past an EOS among the
    accepted drafts (planted) is refused."""
    from helpers import PATHS, random_heads, read_late_and_each_step

    from specdec.decode import engine
    from specdec.drafters.medusa import MedusaDrafter
    from specdec.models import Backend, as_decoder
    from specdec.models.graphs import GraphedDecoder

    target = GraphedDecoder(as_decoder(tiny_target, backend=Backend.emulated_gpu())) if graphs else tiny_target
    ids, mask = left_pad(PROMPTS)
    drafter = MedusaDrafter(random_heads(), tiny_target.lm_head.weight, PATHS if tree else None)
    assert drafter.traits.device_only
    k = 4 if tree else 3
    free = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[])
    cases = [([], {}), ([free.sequences[1][4], free.sequences[2][8]], {}), ([free.sequences[0][0]], {}),
             ([free.sequences[0][5]], {}), ([], {"temperature": 1.0})]
    for eos, sampling in cases:
        each_step, read_late = read_late_and_each_step(monkeypatch, target, drafter, ids, mask, k, eos, **sampling)
        assert read_late == each_step, (eos, sampling)
        if not eos and not sampling:
            assert each_step[0] == free.sequences and each_step[1][4] > 0  # drafts were accepted

    def past_eos(step, live, left, eos):  # the planted bug: a row keeps its accepted drafts past an EOS among them
        count = torch.minimum(step.num_accepted + 1, left) * live
        left -= count
        live &= left > 0
        return count

    monkeypatch.setattr(engine, "_drafted_counts", past_eos)
    with pytest.raises(RuntimeError, match="device-side counts"):
        for eos in [[token] for token in free.sequences[0][1:8]]:  # some EOS lands among accepted drafts
            read_late_and_each_step(monkeypatch, target, drafter, ids, mask, k, eos)


def test_an_ngram_lookup_on_the_device_counts_the_drafts_the_host_lookup_finds(tiny_target, monkeypatch):
    """The n-gram lookup on the device (a GPU's by default): k drafts a row every step, filled past each row's match,
    the genuine ones counted there and read back with the step: at every step the host lookup's drafts and counts, so
    the stats count what the host's drafter proposes; read a step late, eager and replaying a graph (emulated here),
    the outputs and counts of the loop that reads each step (greedy, an EOS, sampled)."""
    from helpers import check_read_late_as_each_step

    class Checked(NgramDrafter):
        def propose(self, state, k):
            proposal, host = super().propose(state, k), NgramDrafter().propose(state, k)
            assert proposal.tokens.shape[1] == k and proposal.counted is not None
            for b, (found, on) in enumerate(zip(proposal.counted.tolist(), state.active)):
                if on:
                    assert found == host.num_proposed[b]
                    assert proposal.tokens[b, :found].tolist() == host.tokens[b, :found].tolist()
                    self.found += found
            return proposal

    ids, mask = left_pad(PROMPTS)
    drafter = Checked(on_device=True)
    drafter.found = 0
    free = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=16, eos_token_id=[])
    out = speculative_generate(tiny_target, drafter, ids, attention_mask=mask, k=3, max_new_tokens=16, eos_token_id=[])
    assert out.sequences == free.sequences and out.stats.proposed_tokens == drafter.found > 0
    assert out.stats.accepted_tokens > 0
    from specdec.models import Backend, as_decoder
    from specdec.models.graphs import GraphedDecoder

    graphed = GraphedDecoder(as_decoder(tiny_target, backend=Backend.emulated_gpu()))
    for target, drafter in ((tiny_target, NgramDrafter(on_device=True)),  # eager, then the lookup in a graph
                            (graphed, NgramDrafter(on_device=True, device="cpu", backend=Backend.emulated_gpu()))):
        assert drafter.traits.device_only
        drafter.runtime.replay_graphs("auto")
        check_read_late_as_each_step(monkeypatch, target, drafter, ids, mask, 3, max_new_tokens=16)
    assert drafter.runtime.graphs.captures > 0 and drafter.runtime.graphs.replays > 10
    assert not NgramDrafter.from_config(NgramDrafter.Config(), target=tiny_target).on_device  # on a CPU: the host's
    assert NgramDrafter.from_config(NgramDrafter.Config(on_device=True), target=tiny_target).on_device


def test_only_drafters_that_read_the_device_alone_are_read_a_step_late(tiny_target):
    """Medusa's dynamic trees (their kept nodes read on the host) and its lookup branch (the host's tokens) are read
    each step; the fixed tree and chain without lookup a step late; EAGLE's chain and fixed tree (grown on the
    device), not its dynamic tree (the levels' choices on the host) nor a lookup branch found on the host; drafters
    say nothing by default."""
    from helpers import PATHS, random_eagle, random_heads

    from specdec.drafters import EagleDrafter
    from specdec.drafters.medusa import MedusaDrafter

    weight = tiny_target.lm_head.weight
    assert MedusaDrafter(random_heads(), weight, PATHS).traits.device_only
    assert not MedusaDrafter(random_heads(), weight, PATHS, min_confidence=0.1).traits.device_only
    assert not MedusaDrafter(random_heads(), weight, PATHS, lookup=2).traits.device_only
    assert not NgramDrafter().traits.device_only
    layer = random_eagle(tiny_target)
    assert EagleDrafter(layer, tree=False).traits.device_only
    assert EagleDrafter(layer, grow_on_device=True).traits.device_only
    assert not EagleDrafter(layer).traits.device_only  # a CPU grows a fixed tree on the host (a GPU, on the device)
    assert not EagleDrafter(layer, min_confidence=0.1, grow_on_device=True).traits.device_only
    assert not EagleDrafter(layer, lookup=2, lookup_on_device=False, grow_on_device=True).traits.device_only


def test_greedy_verification_replays_the_forward_and_its_verdict_as_one_graph(tiny_target, monkeypatch):
    """Greedy, the target's forward and the verdict computed from it (the tree walk, the path, the emitted tokens) are
    one captured graph a step (emulated on CPU): the same tokens and counts as the eager path, per tree shape; a
    graph keyed without the tree's shape (planted: two shapes under one key) replays the other shape's walk."""
    from specdec.models import Backend, as_decoder
    from specdec.models.graphs import GraphedDecoder

    ids, mask = left_pad(PROMPTS[:2])
    ref = autoregressive_generate(tiny_target, ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[])
    rows = [p + s for p, s in zip(PROMPTS[:2], ref.sequences)]

    def run(target, trees):
        out = speculative_generate(target, OracleTreeDrafter(rows, trees), ids, attention_mask=mask, k=4,
                                   max_new_tokens=12, eos_token_id=[])
        assert out.sequences == ref.sequences
        return out.stats.target_forwards, out.stats.accepted_per_position

    # two shapes of one size and width: a chain of three with a sibling at the root (depth 3), two pairs (depth 2)
    trees = ((Tree.from_parents([-1, 0, 1, -1]), [0, 1, 2, None]),
             (Tree.from_parents([-1, -1, 0, 1]), [0, None, 1, None]))
    graphed = GraphedDecoder(as_decoder(tiny_target, backend=Backend.emulated_gpu()))
    eager = run(tiny_target, trees)
    assert run(graphed, trees) == eager and eager[1][2] > 0  # depth 3 reached
    keys = {key[0][:2] for key in graphed.graphs._graphs}
    assert keys == {("forward then", ("greedy", False, (t.parent_list, t.max_depth))) for t, _ in trees}
    assert graphed.replays > graphed.captures
    from specdec.decode import engine

    # planted: one key for all
    monkeypatch.setattr(engine, "_verdict_key", lambda tree, params=None, kernels=None: ("greedy",))
    fresh = GraphedDecoder(as_decoder(tiny_target, backend=Backend.emulated_gpu()))
    assert run(fresh, trees[::-1]) != run(tiny_target, trees[::-1])  # the chain walked only as deep as the siblings


def test_the_sampling_settings_as_one_object(tiny_target):
    """``sampling=SamplingParams(...)`` gives the loose keywords' outputs; both at once, or another object, are
    refused naming what to pass."""
    from specdec.verify.sampling import SamplingParams

    ids = torch.tensor([PROMPTS[0]])

    def sampled(**settings):
        return speculative_generate(tiny_target, NgramDrafter(), ids, k=3, max_new_tokens=8, eos_token_id=[],
                                    generator=torch.Generator().manual_seed(5), **settings).sequences

    assert sampled(sampling=SamplingParams(0.8, 5, 0.9)) == sampled(temperature=0.8, top_k=5, top_p=0.9)
    plain = autoregressive_generate(tiny_target, ids, max_new_tokens=8, eos_token_id=[], sampling=SamplingParams())
    assert plain.sequences == autoregressive_generate(tiny_target, ids, max_new_tokens=8, eos_token_id=[]).sequences
    with pytest.raises(ValueError, match="pass the settings one way"):
        sampled(sampling=SamplingParams(0.8), temperature=0.8)
    with pytest.raises(TypeError, match="SamplingParams"):
        sampled(sampling={"temperature": 0.8})


# --- the sampled verdict inside the target's graph -----------------------------------------------------------


def _graphed_drafting(markov_target, kind: str):
    """A graphed bigram target (emulated on CPU, as a GPU replays it) and a drafter whose work replays graphs too."""
    from helpers import PATHS, markov_draft, markov_heads

    from specdec.drafters.medusa import MedusaDrafter
    from specdec.models import Backend, as_decoder
    from specdec.models.graphs import GraphedDecoder

    backend = Backend.emulated_gpu()
    decoder = GraphedDecoder(as_decoder(markov_target, backend=backend))
    if kind == "chain-q":  # a sampled chain: the draft model reports the q it drew from
        drafter, k = DraftModelDrafter(markov_draft(markov_target), backend=backend), 3
    else:  # fixed candidates (one-hot q); a lookup branch's tokens may repeat a head's at the root
        lookup = 4 if kind == "tree-lookup" else 0
        drafter = MedusaDrafter(markov_heads(), markov_target.lm_head.weight, PATHS, lookup=lookup, backend=backend,
                                lookup_on_device=True)
        k = len(PATHS) + lookup
    drafter.runtime.replay_graphs("auto")
    return decoder, drafter, k


@pytest.mark.parametrize("kind", ["chain-q", "tree", "tree-lookup"])
def test_the_sampled_verdict_in_the_targets_graph_is_exact(markov_target, kind):
    """At T=1 where the target replays graphs, the exact rule runs inside the step's graph over uniforms drawn before
    it (a chain with its drafts' q; a tree of fixed candidates by the siblings-at-once walk, repeated tokens
    included): the emitted tokens pass the exactness test against the target's conditionals, with drafts accepted."""
    from helpers import markov_prompts, sample_and_score

    from specdec.exactness.stats import exactness_test

    decoder, drafter, k = _graphed_drafting(markov_target, kind)
    tokens, probs, positions, stats = sample_and_score(markov_target, drafter, k=k, prompts=markov_prompts,
                                                       decoder=decoder, seed=4)
    assert stats.mean_accepted_length > 1.3 and decoder.replays >= stats.target_forwards
    verdict = exactness_test(probs, tokens, rng=np.random.default_rng(0), alpha=0.01, positions=positions)
    assert not verdict.reject, verdict


def test_a_graphed_draft_chain_draws_each_draft_with_fresh_uniforms(markov_target):
    """A draft model's chain replayed as one graph a step draws its i-th draft with the i-th of uniforms drawn before
    the replay. Each draft is drawn from the q it reports, given the drafts before it: the randomised PIT of every
    draft under its q is uniform, and uncorrelated with the PIT of the draft before it in the step and of the same
    row's first draft a step before (the end-to-end test has little power here: a bias of one row's correlated draws
    averages out over the prompts)."""
    from helpers import markov_prompts

    decoder, drafter, k = _graphed_drafting(markov_target, "chain-q")
    pits, propose, rng = [], drafter.propose, np.random.default_rng(0)

    def recorded(state, k):
        out = propose(state, k)
        q = out.probs.double()
        below = q.cumsum(-1).gather(-1, out.tokens[..., None])[..., 0] - q.gather(-1, out.tokens[..., None])[..., 0]
        mass = q.gather(-1, out.tokens[..., None])[..., 0]
        pits.append(((below + torch.from_numpy(rng.random(mass.shape)) * mass) / q.sum(-1)).numpy())  # [B, K]
        return out

    drafter.propose = recorded
    ids = markov_prompts(300, torch.Generator().manual_seed(0))
    speculative_generate(decoder, drafter, ids, attention_mask=torch.ones_like(ids), k=k, max_new_tokens=8,
                         temperature=1.0, eos_token_id=[], generator=torch.Generator().manual_seed(1))
    assert drafter.runtime.graphs.replays == len(pits) > 3
    pit = np.stack(pits)  # [steps, B, K]
    from scipy import stats

    assert stats.kstest(pit.ravel(), "uniform").pvalue > 1e-3
    for a, b in ((pit[..., :-1], pit[..., 1:]), (pit[:-1, :, 0], pit[1:, :, 0])):  # in a step; a step apart
        assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.1


@pytest.mark.parametrize("bug", ["no renormalisation", "recovered from p"])
def test_a_planted_bug_in_the_graphs_tree_walk_is_caught(markov_target, monkeypatch, bug):
    """The same test rejects the graph's tree walk with a planted bug: a later sibling tested against p not
    renormalised after the earlier ones' rejection, or the next token drawn from p where every child was rejected."""
    from helpers import markov_prompts, sample_and_score

    from specdec.exactness.stats import exactness_test
    from specdec.verify import tree

    if bug == "no renormalisation":
        monkeypatch.setattr(tree, "untried_mass", torch.ones_like)
    else:
        monkeypatch.setattr(tree, "without_rejected", lambda p, tokens, rejected: p)
    decoder, drafter, k = _graphed_drafting(markov_target, "tree")
    tokens, probs, positions, _ = sample_and_score(markov_target, drafter, k=k, prompts=markov_prompts,
                                                   decoder=decoder, seed=4)
    verdict = exactness_test(probs, tokens, rng=np.random.default_rng(0), alpha=0.01, positions=positions)
    assert verdict.reject, verdict
