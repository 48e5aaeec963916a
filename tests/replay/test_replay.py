"""Replay on tiny random models: replayed greedy runs equal live ones step for step (every registered drafter, chains
at every K <= K_max, trees, EOS and max_new_tokens cuts), and logs that do not fit are refused.

The exactness comparison was shown to catch planted bugs (2026-11-26, each planted in specdec/replay/simulate.py by
hand, test_replay_equals_live run, the bug removed): stepping on one token too far (``j += len(kept) + 1``) failed
all 18 cases; a chain read one draft too long (``drafts = proposed.tokens[:k + 1]``) failed the 6 n-gram, draft-model
and Medusa chain cases (a random EAGLE chain and the confidence-cut draft model never get the extra draft accepted);
the tree walk reading the continuation one level deep (``c[j + d + 1]``) failed all 8 tree cases; dropping the cut
after an EOS failed the 5 EOS cases whose runs stop at an EOS inside accepted drafts. The planted rule of
test_a_planted_bug_is_caught keeps one such bug in the suite. The draft model's heuristic schedule replayed at a
constant length (``next_length("constant", ...)`` in ``replay_prompt``, 2026-11-28) failed both of its cases.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import PATHS, make_markov_target, markov_blocks, markov_heads, noisy_copy, random_eagle, tiny_llama, word_tokenizer

from specdec import DraftModelDrafter, NgramDrafter, autoregressive_generate, speculative_generate
from specdec.drafters.base import DRAFTERS
from specdec.drafters.dflash import DFlashDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.medusa import MedusaDrafter
from specdec.replay import ReplayLog, ReplayMismatchError, log_proposals, replay
from specdec.replay import simulate
from specdec.replay.cache import cached_log, load_log

NEW = 20
COUNTS = ("verify_steps", "verified_tokens", "proposed_tokens", "accepted_per_position", "proposed_per_position",
          "new_tokens", "tree_steps", "target_forwards")


def eagle(target, **options) -> EagleDrafter:
    model = random_eagle(target, aux=(0, 1, 2))
    with torch.no_grad():
        model.lm_head.weight.copy_(target.lm_head.weight)  # drafts that are sometimes right
    return EagleDrafter(model, **options)


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(layers=3, seed=0)
    return {"tiny": target, "close": noisy_copy(target), "markov": make_markov_target()}


# (target, drafter factory, K_max: chains replay every K up to it; trees at it). Every registered drafter is here.
CASES = {
    "ngram": ("tiny", lambda m: NgramDrafter(min_ngram=1), 6),
    "draft_model": ("tiny", lambda m: DraftModelDrafter(m["close"]), 6),
    "draft_model_confidence": ("tiny", lambda m: DraftModelDrafter(m["close"], confidence=0.3), 6),
    "draft_model_heuristic": ("tiny", lambda m: DraftModelDrafter(m["close"], schedule="heuristic"), 6),
    "eagle": ("tiny", lambda m: eagle(m["tiny"], tree=False), 4),
    "eagle_tree": ("tiny", lambda m: eagle(m["tiny"], depth=3, top_k=2, expand=2), 8),
    "eagle_tree_lookup": ("tiny", lambda m: eagle(m["tiny"], depth=3, top_k=2, expand=2, lookup=3), 8),
    "medusa": ("markov", lambda m: MedusaDrafter(markov_heads(3, strength=2.0), m["markov"].lm_head.weight), 3),
    "medusa_tree": ("markov", lambda m: MedusaDrafter(markov_heads(3, strength=2.0), m["markov"].lm_head.weight,
                                                      PATHS, lookup=2), 10),
    "medusa_dynamic_tree": ("markov", lambda m: MedusaDrafter(markov_heads(3, strength=2.0),
                                                              m["markov"].lm_head.weight, PATHS,
                                                              min_confidence=0.3), 8),
    "dflash": ("markov", lambda m: DFlashDrafter(markov_blocks(m["markov"])), 4),
    "dflash_tree": ("markov", lambda m: DFlashDrafter(markov_blocks(m["markov"]), PATHS), 8),
}
PROMPTS = [[5, 9, 3, 7, 11, 2, 8, 5, 9, 3], [4, 4, 6], [12, 13, 14, 15, 12, 13], [33, 1, 60, 33, 1]]


def test_every_drafter_is_covered():
    assert {name for name in DRAFTERS} <= {case.split("_tree")[0].split("_confidence")[0].split("_heuristic")[0]
                                           for case in CASES}


def eos_for(target) -> list[int]:
    """A stop token that occurs early in the first prompt's greedy continuation, so runs end at EOS too."""
    out = autoregressive_generate(target, torch.tensor([PROMPTS[0]]), max_new_tokens=8, eos_token_id=[])
    return [out.sequences[0][5]]


def mismatches(target, make, log: ReplayLog, k: int, eos: list[int]) -> list[str]:
    """Where the replay of ``log`` at ``k`` differs from live greedy runs of a fresh drafter (one line each)."""
    found = []
    for prompt, replayed in zip(PROMPTS, replay(log, k)):
        live = speculative_generate(target, make(), torch.tensor([prompt]), k=k, max_new_tokens=log.max_new_tokens,
                                    eos_token_id=eos).stats
        for name in COUNTS:
            if getattr(live, name) != getattr(replayed, name):
                found.append(f"prompt {prompt} k={k} {name}: live {getattr(live, name)}, replayed "
                             f"{getattr(replayed, name)}")
    return found


@pytest.mark.parametrize("stop", [False, True], ids=["no_eos", "eos"])
@pytest.mark.parametrize("case", list(CASES))
def test_replay_equals_live(models, case, stop):
    """Replayed α, α per position, τ and token counts equal live greedy runs', at every K <= K_max (chains)."""
    name, make, k_max = CASES[case]
    target = models[name]
    eos = eos_for(target) if stop else []
    log = log_proposals(target, make(models), PROMPTS, k_max=k_max, max_new_tokens=NEW, eos_token_id=eos)
    ks = [k_max] if log.tree else range(1, k_max + 1)
    assert log.tree == ("tree" in case)
    found = [line for k in ks for line in mismatches(target, lambda: make(models), log, k, eos)]
    assert not found, "\n".join(found)
    taus = [s.mean_accepted_length for s in replay(log, k_max)]
    if case not in ("eagle", "eagle_tree", "eagle_tree_lookup", "ngram"):  # a random EAGLE rarely hits
        assert max(taus) > 1.5, f"{case}: τ {taus}: drafts never accepted, a weak test"
    if stop:
        assert any(s.new_tokens < NEW for s in replay(log, k_max)), "no run ended at the EOS"


def test_a_planted_bug_is_caught(models, monkeypatch):
    """A replay whose chain rule accepts one draft more than the verifier does is caught."""
    name, make, k_max = CASES["draft_model"]
    target = models[name]
    log = log_proposals(target, make(models), PROMPTS, k_max=k_max, max_new_tokens=NEW, eos_token_id=[])
    real = simulate.greedy_chain

    def one_too_many(drafts, target_tokens):  # planted: accepts a draft past the first mismatch
        accepted, nxt = real(drafts, target_tokens)
        return (accepted + 1).clamp(max=drafts.shape[1]), nxt

    monkeypatch.setattr(simulate, "greedy_chain", one_too_many)
    assert mismatches(target, lambda: make(models), log, 3, [])


def test_max_new_tokens_one_has_no_step(models):
    log = log_proposals(models["tiny"], NgramDrafter(), PROMPTS[:1], k_max=2, max_new_tokens=1, eos_token_id=[])
    live = speculative_generate(models["tiny"], NgramDrafter(), torch.tensor(PROMPTS[:1]), k=2, max_new_tokens=1,
                                eos_token_id=[]).stats
    replayed, = replay(log, 2)
    assert (replayed.verify_steps, replayed.new_tokens) == (live.verify_steps, live.new_tokens) == (0, 1)


def test_refused_beyond_what_was_logged(models):
    chain = log_proposals(models["tiny"], NgramDrafter(), PROMPTS[:1], k_max=4, max_new_tokens=8, eos_token_id=[])
    with pytest.raises(ReplayMismatchError, match=r"K_max=4.*k=5"):
        replay(chain, 5)
    tree = log_proposals(models["markov"], CASES["medusa_tree"][1](models), PROMPTS[:1], k_max=10, max_new_tokens=8,
                         eos_token_id=[])
    with pytest.raises(ReplayMismatchError, match=r"k=10 nodes, asked for k=6"):
        replay(tree, 6)


def test_refused_for_another_target_drafter_or_tokenizer(models, tmp_path):
    words = [f"w{i}" for i in range(64)]
    tokenizer, other_tokenizer = word_tokenizer(words), word_tokenizer(list(reversed(words)))
    log, path, from_disk = cached_log(models["tiny"], NgramDrafter(), PROMPTS, k_max=4, max_new_tokens=8,
                                      tokenizer=tokenizer, eos_token_id=[], directory=tmp_path)
    assert not from_disk and path.is_file()
    again, _, from_disk = cached_log(models["tiny"], NgramDrafter(), PROMPTS, k_max=4, max_new_tokens=8,
                                     tokenizer=tokenizer, eos_token_id=[], directory=tmp_path)
    assert from_disk and [s.summary() for s in replay(again, 3)] == [s.summary() for s in replay(log, 3)]
    assert load_log(path, models["tiny"], NgramDrafter(), tokenizer, k=4).k_max == 4
    other = tiny_llama(layers=3, seed=5)
    with pytest.raises(ReplayMismatchError, match="another target: logged .*weights.*asked for .*weights"):
        load_log(path, other, NgramDrafter(), tokenizer)
    with pytest.raises(ReplayMismatchError, match="another drafter: logged .*max_ngram.: 3.*asked for .*max_ngram.: 5"):
        load_log(path, models["tiny"], NgramDrafter(max_ngram=5), tokenizer)
    with pytest.raises(ReplayMismatchError, match="another drafter: logged .*NgramDrafter.*DraftModelDrafter"):
        load_log(path, models["tiny"], DraftModelDrafter(models["close"]), tokenizer)
    with pytest.raises(ReplayMismatchError, match="another tokenizer"):
        load_log(path, models["tiny"], NgramDrafter(), other_tokenizer)
    with pytest.raises(ReplayMismatchError, match=r"K_max=4.*k=6"):
        load_log(path, models["tiny"], NgramDrafter(), tokenizer, k=6)


def test_refused_what_replay_cannot_reproduce(models):
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        log_proposals(models["tiny"], NgramDrafter(), PROMPTS, k_max=2, max_new_tokens=4, temperature=-0.7)


def test_a_log_round_trips(models, tmp_path):
    log = log_proposals(models["markov"], CASES["medusa_tree"][1](models), PROMPTS, k_max=10, max_new_tokens=NEW,
                        eos_token_id=[])
    again = ReplayLog.load(log.save(tmp_path / "log.json"))
    assert [s.summary() for s in replay(again)] == [s.summary() for s in replay(log)]


def test_cost_model_interpolates_and_times_a_replay(models, tmp_path):
    from specdec.decode.metrics import summarize, total
    from specdec.replay.__main__ import predicted_by_k
    from specdec.replay.costs import CostModel
    from specdec.replay.simulate import plain_stats

    costs = CostModel({1: 1.0, 3: 2.0, 5: 5.0}, {1: 0.5, 4: 2.0}, {1: 0.25, 4: 0.5}, 0.125)
    assert (costs.verify(2), costs.verify(4), costs.verify(10), costs.verify(2.5)) == (1.5, 3.5, 10.0, 1.75)
    assert (costs.draft(1), costs.draft(3), costs.draft(8)) == (0.5, 2.0, 2.0)
    assert (costs.step(3, 1), costs.step(5, 4), costs.plain_step()) == (2.75, 7.5, 1.125)
    log, path, _ = cached_log(models["tiny"], CASES["draft_model"][1](models), PROMPTS, k_max=3, max_new_tokens=NEW,
                              eos_token_id=[], directory=tmp_path, costs=True)
    model = ReplayLog.load(path).cost_model(1)
    assert set(model.verify_s) == {1, 2, 3, 4} and set(model.draft_s) == set(model.host_s) == {1, 2, 3}
    assert all(t > 0 for t in [*model.verify_s.values(), *model.draft_s.values()]) and model.batch_size == 1
    spec = replay(log, 2)  # the draft model always drafts k: every verify block is 3 wide
    base = [plain_stats(s, model) for s in spec]
    figures = summarize(total(spec), total(base), 2, len(PROMPTS))
    spec_all, step = total(spec), model.step(3, 2)
    decoded = spec_all.new_tokens - spec_all.prefill_tokens  # one plain step each
    assert model.setup_s > 0  # the draft model reads the prompt once a generation: counted once per prompt
    assert figures["speedup"] == pytest.approx(decoded * model.plain_step() / (spec_all.verify_steps * step
                                                                               + len(PROMPTS) * model.setup_s))
    assert spec_all.target_time_s == pytest.approx(spec_all.verify_steps * model.verify(3))
    assert predicted_by_k(log, [1, 2], 1)["2"] == pytest.approx(figures["decode_speedup"])  # the replay job's, by K


def test_costs_are_kept_per_batch_size(models, tmp_path):
    from specdec.decode.metrics import total

    options = dict(k_max=2, max_new_tokens=NEW, eos_token_id=[], directory=tmp_path, costs=True)
    drafter = CASES["ngram"][1](models)
    log, path, _ = cached_log(models["tiny"], drafter, PROMPTS, **options)
    log, _, from_disk = cached_log(models["tiny"], drafter, PROMPTS, cost_batch=3, **options)
    assert not from_disk and sorted(ReplayLog.load(path).costs) == ["1", "3"]  # the batch-3 model added to the file
    three = log.cost_model(3)
    assert three.batch_size == 3 and set(three.host_s) == {1, 2}
    assert log.cost_model(2) is None
    assert three.verify(1) != log.cost_model(1).verify(1)
    one, batched = total(replay(log, 2)), total(replay(log, 2, batch_size=3))  # batch 1's acceptance, 3's times
    assert (batched.verify_steps, batched.verified_tokens) == (one.verify_steps, one.verified_tokens)
    assert batched.wall_time_s != one.wall_time_s


def test_a_batch_steps_together_at_its_widest_block_until_its_slowest_row_ends():
    """Two rows of a greedy chain log (K=2, 5 new tokens): row 0 drafts right every step, row 1 finds nothing to
    draft. Alone, row 1 costs a plain-width step a token; batched with row 0, every step is as wide as row 0's block,
    and the batch takes as many steps as row 1 (its slowest row)."""
    from dataclasses import asdict, replace

    from specdec.replay.costs import CostModel
    from specdec.replay.log import PromptLog, Proposed
    from specdec.replay.simulate import batched_speedup

    c = [5, 6, 7, 8, 9, 10, 11]
    drafting = PromptLog([1], c, [Proposed(c[j: j + 2], None, 2) for j in range(1, 6)])
    idle = PromptLog([1], c, [Proposed([], None, 0) for _ in range(1, 6)])
    costs = CostModel({1: 1.0, 3: 2.0}, {2: 0.0}, {2: 0.0}, 0.0)
    log = ReplayLog({}, {}, None, 5, 0.0, [], 2, False, [drafting, idle],
                    costs={"1": asdict(costs), "2": asdict(replace(costs, batch_size=2))})
    # alone: row 0 steps from positions 1 and 4 (blocks of 3), 4 s; row 1 takes 4 plain-width steps, 4 s; plain 4 s each
    assert batched_speedup(log, 2, 1) == pytest.approx((4 + 4) / (4 + 4))
    # together: 4 steps (row 1's), the first two 3 wide (row 0's blocks), then 1 wide once row 0 has ended
    assert batched_speedup(log, 2, 2) == pytest.approx(4 / (2 * 2.0 + 2 * 1.0))


def test_a_run_longer_than_the_log_pays_the_drafters_once_a_generation_work_over_all_its_tokens():
    """k=auto logs 48 tokens a prompt and predicts a run of data.max_new_tokens: the drafter's once-a-generation work
    (2 s here) is paid once over the run's tokens, so a run twice the log's length carries half of it over the
    logged tokens; a shorter run is replayed over its own first tokens; a row that stopped early stops there live."""
    from dataclasses import asdict

    from specdec.decode.metrics import DecodeStats
    from specdec.replay.costs import CostModel
    from specdec.replay.log import PromptLog, Proposed
    from specdec.replay.simulate import batched_speedup, setup_share

    c = [5, 6, 7, 8, 9, 10, 11]
    drafting = PromptLog([1], c, [Proposed(c[j: j + 2], None, 2) for j in range(1, 6)])
    costs = CostModel({1: 1.0, 3: 2.0}, {2: 0.0}, {2: 0.0}, 0.0, setup_s=2.0)
    log = ReplayLog({}, {}, None, 5, 0.0, [], 2, False, [drafting], costs={"1": asdict(costs)})
    # two steps of 2 s (blocks of 3 from positions 1 and 4) against four plain steps of 1 s, and the 2 s once
    assert batched_speedup(log, 2, 1) == pytest.approx(4 / (4 + 2))
    assert batched_speedup(log, 2, 1, run_tokens=10) == pytest.approx(4 / (4 + 2 * 5 / 10))
    assert batched_speedup(log, 2, 1, run_tokens=3) == pytest.approx(2 / (2 + 2))  # one step, 3 tokens
    stopped, running = DecodeStats(new_tokens=3), DecodeStats(new_tokens=5)
    assert setup_share([stopped], 5, 10) == 1.0 and setup_share([stopped, running], 5, 10) == 0.5


def test_a_heuristic_schedule_replays_its_length_over_the_batchs_rows_together():
    """The draft model's heuristic schedule (+2 after a step whose rows kept every draft, else -1) is one length for
    the batch: two rows (K=4, 9 tokens), row 0 always right, row 1 always wrong. Together the length falls 4, 3, 2, 1
    (row 1 never keeps all); row 0 alone would keep 4. The replay re-enacts it a step at a time, and the heuristic
    log replays its length a prompt at a time too (test_replay_equals_live: the live loop's counts)."""
    from dataclasses import asdict, replace

    from specdec.replay.costs import CostModel
    from specdec.replay.log import PromptLog, Proposed
    from specdec.replay.simulate import batched_speedup

    c = list(range(10, 24))
    right = PromptLog([1], c, [Proposed(c[j: j + 4], None, 4) for j in range(1, 9)])
    wrong = PromptLog([1], c, [Proposed([0] * 4, None, 4) for _ in range(1, 9)])
    costs = CostModel({w: float(w) for w in range(1, 6)}, {}, {}, 0.0)  # a step costs its block's width
    log = ReplayLog({}, {}, None, 9, 0.0, [], 4, False, [right, wrong], schedule="heuristic",
                    costs={"2": asdict(replace(costs, batch_size=2))})
    # 8 steps (row 1's): blocks 5, 4, 3 (row 0 ends), then 2 each; plain decoding 8 steps of 1
    assert batched_speedup(log, 4, 2) == pytest.approx(8 / (5 + 4 + 3 + 2 * 5))
    constant = replace(log, schedule="constant")  # blocks 5, 5 (row 0 ends), then row 1's 5 each
    assert batched_speedup(constant, 4, 2) == pytest.approx(8 / (5 * 8))
    alone = [simulate.replay_prompt(p, 4, max_new_tokens=9, eos=[], schedule="heuristic") for p in (right, wrong)]
    assert [s.verify_steps for s in alone] == [2, 8] and [s.proposed_tokens for s in alone] == [8, 4 + 3 + 2 + 5]


def test_a_tree_logs_cost_model_times_its_trees(models, tmp_path):
    from specdec.replay.costs import logged_trees

    log, _, _ = cached_log(models["markov"], CASES["medusa_tree"][1](models), PROMPTS, k_max=10, max_new_tokens=NEW,
                           eos_token_id=[], directory=tmp_path, costs=True)
    trees = logged_trees(log)
    assert trees and all(tree.num_nodes + 1 == width for width, tree in trees.items())
    model = log.cost_model(1)
    assert set(model.verify_s) == set(range(1, 12)) and set(model.draft_s) == set(model.host_s) == {10}


def test_a_step_cost_curve_times_the_verify_steps_at_its_batch_size(tmp_path):
    """costs=<a curve> (experiments/benchmarks/step_costs.py's JSON, e.g. the H200's at Llama-3.1-8B's shape): the
    verify times at the replay's batch size, drafting and host work free; a batch it lacks and a file that is not a
    curve are refused naming what to give."""
    import json

    from specdec.replay.costs import CostModel

    curve = {"mark": "SYNTHETIC", "shape": "llama-3.1-8b", "layers": 32, "dtype": "torch.bfloat16", "device": "H200",
             "rows": [{"batch": b, "width": w, "ms": ms} for b, w, ms in
                      [(1, 1, 4.0), (1, 4, 4.2), (1, 16, 5.0), (8, 1, 4.5), (8, 16, 9.0)]]}
    path = tmp_path / "step_costs_llama-3.1-8b.json"
    path.write_text(json.dumps(curve))
    costs = CostModel.from_curve(path, 1)
    assert costs.plain_step() == pytest.approx(4e-3) and costs.step(4, 3) == pytest.approx(4.2e-3)
    assert costs.verify(10) == pytest.approx(4.6e-3) and costs.draft(8) == 0.0 and "llama-3.1-8b" in costs.machine
    assert CostModel.from_curve(path, 8).verify(16) == pytest.approx(9e-3)
    with pytest.raises(ValueError, match=r"holds batch sizes \[1, 8\], not data.batch_size=4"):
        CostModel.from_curve(path, 4)
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(ValueError, match="is not a step-cost curve"):
        CostModel.from_curve(tmp_path / "other.json", 1)


def test_a_curves_drafter_rows_time_each_drafters_step(models, tmp_path):
    """A curve with its drafters' steps (step_costs.py --drafters) times each drafting step as the drafter runs it
    (EAGLE: catch-up over τ tokens and a level of ``expand`` nodes per logged forward after it, ``depth - 1`` unlogged;
    a draft model: a forward over 2 tokens and a one-token step per logged forward after it; Medusa's heads and the
    block drafter's block once), at the replay's batch size; a drafter the curve lacks (n-gram) or a curve without
    rows counts drafting free. The log counts each proposal's forwards; a replay timed by the curve pays the drafting
    steps: its prediction is the verify and drafting times summed (planted: the rows read but not timed_by)."""
    import json

    from specdec.decode.metrics import total
    from specdec.replay.__main__ import curve_steps
    from specdec.replay.costs import CostModel
    from specdec.replay.simulate import batched_speedup

    def rows(batch, scale):
        return [{"drafter": d, "batch": batch, "width": w, "ms": ms * scale} for d, w, ms in
                [("eagle", 1, 1.0), ("eagle", 4, 2.0), ("eagle", 8, 3.0), ("medusa", None, 0.5),
                 ("dflash", None, 2.5), ("draft_model", 1, 0.4), ("draft_model", 4, 0.7), ("draft_model", 8, 1.0)]]
    curve = {"mark": "SYNTHETIC", "shape": "llama-3.1-8b", "layers": 32, "dtype": "torch.bfloat16", "device": "H200",
             "rows": [{"batch": b, "width": w, "ms": ms} for b, w, ms in [(1, 1, 4.0), (1, 3, 4.1), (1, 16, 5.0),
                                                                          (8, 1, 4.5)]],
             "drafter_rows": rows(1, 1.0) + rows(8, 2.0) + [{"drafter": "medusa", "batch": 1, "error": "planted"}]}
    path = tmp_path / "step_costs_llama-3.1-8b.json"
    path.write_text(json.dumps(curve))
    costs = CostModel.from_curve(path, 1)
    tree = {"name": "eagle", "tree": True, "depth": 6, "top_k": 4, "expand": 4}
    unlogged = costs.drafting_from_curve(tree, {24: (2.0, None)})
    assert unlogged.draft(24) == pytest.approx((1.0 + 1 / 3 + 5 * 2.0) / 1e3) and "5.00 levels" in unlogged.drafting
    logged = costs.drafting_from_curve(tree, {24: (2.0, 2.5)})  # the catch-up and 1.5 levels a proposal
    assert logged.draft(24) == pytest.approx((1.0 + 1 / 3 + 1.5 * 2.0) / 1e3) and "as logged" in logged.drafting
    chain = costs.drafting_from_curve({**tree, "tree": False}, {1: (1.5, None), 3: (2.0, None)})
    assert (chain.draft(1), chain.draft(3)) == pytest.approx(((1.0 + 0.5 / 3) / 1e3, (1.0 + 1 / 3 + 2.0) / 1e3))
    assert costs.drafting_from_curve({"name": "medusa"}, {23: (1.8, 1.0)}).draft(23) == pytest.approx(0.5e-3)
    assert costs.drafting_from_curve({"name": "dflash"}, {16: (2.0, 1.0)}).draft(16) == pytest.approx(2.5e-3)
    assert CostModel.from_curve(path, 8).drafting_from_curve({"name": "dflash"}, {16: (2.0, 1.0)}).draft(16) == \
        pytest.approx(5e-3)
    draft = {"name": "draft_model"}
    assert costs.drafting_from_curve(draft, {4: (2.5, None)}).draft(4) == pytest.approx((0.5 + 3 * 0.4) / 1e3)
    assert costs.drafting_from_curve(draft, {4: (2.5, 2.0)}).draft(4) == pytest.approx((0.5 + 0.4) / 1e3)
    for free in (costs.drafting_from_curve({"name": "ngram"}, {4: (1.4, None)}),
                 CostModel(verify_s=costs.verify_s).drafting_from_curve(tree, {24: (2.0, None)})):
        assert free.draft(4) == 0.0 and free.drafting == ""

    log, _, _ = cached_log(models["tiny"], CASES["draft_model"][1](models), PROMPTS, k_max=3, max_new_tokens=NEW,
                           eos_token_id=[], directory=tmp_path)
    assert {p.forwards for prompt in log.prompts for p in prompt.proposals} == {3}  # a forward a draft, K_max of them
    steps = curve_steps(log, 2, tree=False)
    assert sorted(steps) == [1, 2, 3] and steps[2] == pytest.approx((total(replay(log, 2)).mean_accepted_length, 2))
    timed = costs.drafting_from_curve(draft, steps)
    spec = total(replay(log, 2))  # the draft model always drafts k: every block is 3 wide
    expected = (spec.new_tokens - spec.prefill_tokens) * costs.verify(1) / (spec.verify_steps * (costs.verify(3)
                                                                                                + timed.draft(2)))
    assert timed.draft(2) == pytest.approx((0.5 + 0.4) / 1e3)
    assert batched_speedup(log.timed_by(timed), 2, 1) == pytest.approx(expected)
    assert batched_speedup(log.timed_by(costs), 2, 1) > expected  # drafting free: the upper bound
    eagle_log, _, _ = cached_log(models["tiny"], CASES["eagle_tree"][1](models), PROMPTS, k_max=8, max_new_tokens=NEW,
                                 eos_token_id=[], directory=tmp_path)
    counts = {p.forwards for prompt in eagle_log.prompts for p in prompt.proposals}
    assert counts and counts <= {1, 2, 3}  # the catch-up and at most depth - 1 = 2 levels


def test_the_replay_job_reads_its_costs_setting_before_any_model_loads(tmp_path):
    """costs=true or false measures here or not; a curve's path is read (and a bad one refused) before the target
    loads; anything else is refused naming the three forms."""
    from omegaconf import OmegaConf

    from specdec.replay.__main__ import cost_curve

    def cfg(costs, batch=1):
        return OmegaConf.create({"costs": costs, "data": {"batch_size": batch}})

    assert cost_curve(cfg(True)) is None and cost_curve(cfg(False)) is None
    curve = Path(__file__).resolve().parents[2] / "experiments/gpu/results/h200-2026-11-27/step_costs_llama-3.1-8b.json"
    model = cost_curve(cfg(str(curve), batch=8))
    assert model.batch_size == 8 and "SYNTHETIC" in model.machine and model.verify(16) > model.verify(1)
    with pytest.raises(ValueError, match="costs must be true, false or the path of a step-cost curve"):
        cost_curve(cfg(3))
    with pytest.raises(ValueError, match="is not a step-cost curve"):
        cost_curve(cfg(str(tmp_path / "missing.json")))


@pytest.mark.parametrize("case", ["dflash", "dflash_tree", "eagle_tree"])
def test_a_log_is_read_back_by_the_drafter_as_built(case, models, tmp_path):
    """A log names the drafter as it was built, not the state a generation left in it (the block drafter's newest
    context, a tensor after its first step): a later run with the same drafter reads it back."""
    target, make, k_max = CASES[case]
    options = dict(k_max=k_max, max_new_tokens=8, eos_token_id=[], directory=tmp_path)
    drafter = make(models)
    log, _, from_disk = cached_log(models[target], drafter, PROMPTS[:2], **options)
    again, _, read = cached_log(models[target], drafter, PROMPTS[:2], **options)  # after the logging pass's steps
    assert not from_disk and read and again.drafter == log.drafter
