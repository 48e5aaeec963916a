"""``drafter.k=auto``: the lookahead with the best predicted speedup, or none where drafting does not pay, decided from
a replay timed by the cost model (costs planted here, so the decision is the test's, not the machine's load); the
candidates it tries; the main job deciding and decoding with it (the real default target, tiny budgets)."""

import json
from dataclasses import asdict

import pytest
import torch
from helpers import noisy_copy, tiny_llama
from test_replay_job import TINY, job

from specdec import DraftModelDrafter, NgramDrafter
from specdec.jobs.runs import machine_description
from specdec.replay import ReplayLog
from specdec.replay.auto import CHAIN_KS, TREE_SIZES, AutoSettings, auto_candidates, choose_lookahead
from specdec.replay.cache import cached_log
from specdec.replay.costs import CostModel

PROMPTS = [[5, 9, 3, 7, 11, 2, 8, 5, 9, 3, 7, 11], [4, 4, 6, 4, 4, 6, 4, 4], [12, 13, 14, 15, 12, 13, 14, 15]]
NEW = 24
THIS_MACHINE = machine_description(torch.device("cpu"))


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(layers=3, seed=0)
    return target, DraftModelDrafter(noisy_copy(target))  # a draft that is often right


def choose(target, drafter, directory, costs: CostModel, machine: str = THIS_MACHINE, margin: float = 0.05,
           timing=None):
    """choose_lookahead over a log whose cost model is ``costs`` (planted in the cached file before choosing, as
    measured on ``machine``), timed through ``timing`` (None: ``target``)."""
    common = dict(max_new_tokens=NEW, eos_token_id=[], directory=directory, tree=False)
    _, path, _ = cached_log(target, drafter, PROMPTS, k_max=4, costs=False, **common)
    log = ReplayLog.load(path)
    costs.machine = machine
    log.costs = {"1": asdict(costs)}
    log.save(path)
    settings = AutoSettings(tree=False, ks=(1, 2, 3, 4), max_new_tokens=NEW, seeds=1, margin=margin,
                            log_dir=directory)
    return choose_lookahead(target, drafter, PROMPTS, settings, batch_size=1, eos=[], timing=timing)


def test_it_drafts_at_the_best_predicted_lookahead_where_verifying_is_nearly_free(models, tmp_path):
    flat = CostModel({1: 1.0, 5: 1.1}, {k: 0.01 for k in range(1, 5)}, {k: 0.0 for k in range(1, 5)})
    choice = choose(*models, tmp_path, flat)
    assert choice.k == max(choice.predicted, key=choice.predicted.get) and choice.predicted[choice.k] > 1.05
    assert sorted(choice.predicted) == [1, 2, 3, 4] and all(t >= 1 for t in choice.tau.values())
    assert choice.as_dict()["k"] == choice.k and choice.logs


def test_it_does_not_draft_where_nothing_pays(models, tmp_path):
    linear = CostModel({1: 1.0, 5: 5.0}, {k: 0.5 for k in range(1, 5)}, {k: 0.1 for k in range(1, 5)})
    choice = choose(*models, tmp_path, linear)
    assert choice.k == 0 and max(choice.predicted.values()) < 1


def test_a_gain_within_the_margin_is_not_taken(models, tmp_path):
    flat = CostModel({1: 1.0, 5: 1.1}, {k: 0.01 for k in range(1, 5)}, {k: 0.0 for k in range(1, 5)})
    best = max(choose(*models, tmp_path, flat).predicted.values())
    assert choose(*models, tmp_path, flat, margin=best - 1 + 0.01).k == 0
    assert choose(*models, tmp_path, flat, margin=best - 1 - 0.01).k > 0


def test_costs_measured_on_another_machine_are_measured_again(models, tmp_path):
    planted = CostModel({1: 1.0, 5: 5.0}, {k: 0.5 for k in range(1, 5)}, {k: 0.1 for k in range(1, 5)})
    choice = choose(*models, tmp_path, planted, machine="another machine")
    remeasured = ReplayLog.load(choice.logs[0]).cost_model(1)
    assert remeasured.machine == THIS_MACHINE and remeasured.verify_s != planted.verify_s


def test_a_run_that_replays_graphs_is_timed_through_them(models, tmp_path):
    """On a GPU the run replays graphs: the logs come from the target's eager forwards, the costs are measured through
    the graphed decoder the run decodes with (emulated here), and say so, so that costs timed eagerly on this machine
    are measured again (an H200's eager step is ~10x its graphed one)."""
    from specdec.models import Backend, GraphedDecoder, as_decoder

    target, drafter = models
    eager = CostModel({1: 1.0, 5: 5.0}, {k: 0.5 for k in range(1, 5)}, {k: 0.1 for k in range(1, 5)})
    graphed = GraphedDecoder(as_decoder(target, backend=Backend.emulated_gpu()))
    choice = choose(target, drafter, tmp_path, eager, timing=graphed)
    remeasured = ReplayLog.load(choice.logs[0]).cost_model(1)
    assert remeasured.machine == THIS_MACHINE + ", graphs replayed" and remeasured.verify_s != eager.verify_s
    assert graphed.replays > 0


def test_candidates():
    from helpers import PATHS, make_markov_target, markov_heads

    from specdec.drafters.medusa import MedusaDrafter

    ngram = NgramDrafter()
    assert auto_candidates(ngram, tree=False) == list(CHAIN_KS)
    assert auto_candidates(ngram, tree=True) == list(TREE_SIZES)
    assert auto_candidates(ngram, tree=False, given=[4, 2, 2]) == [2, 4]
    with pytest.raises(ValueError, match=r"must be integers >= 1, got \[0, 2\]"):
        auto_candidates(ngram, tree=False, given=[0, 2])
    lm_head = make_markov_target().lm_head.weight
    medusa = MedusaDrafter(markov_heads(3, strength=2.0), lm_head, PATHS, lookup=4)  # sizes 5 .. 4 + its paths
    assert auto_candidates(medusa, tree=True) == [s for s in TREE_SIZES if 4 < s <= 4 + len(PATHS)]
    assert auto_candidates(MedusaDrafter(markov_heads(3, strength=2.0), lm_head), tree=False) == [1, 2, 3]
    with pytest.raises(ValueError, match=r"MedusaDrafter drafts at none of the sizes \[2, 4\]"):
        auto_candidates(medusa, tree=True, given=[2, 4])


def test_build_drafter_refuses_auto(models):
    from specdec.drafters import build_drafter

    with pytest.raises(ValueError, match="drafter.k='auto' is chosen by the main job"):
        build_drafter({"name": "ngram", "k": "auto"}, models[0])


@pytest.mark.real_model
def test_the_main_job_chooses_and_decodes_with_it(tmp_path):
    """drafter.k=auto is the main job's default (configs/run.yaml): no drafter.k given."""
    overrides = ["drafter=ngram", *TINY, "auto.prompts_per_source=1", "auto.max_new_tokens=16",
                 "auto.ks=[1,2]", f"auto.log_dir={tmp_path}/logs", "warmup=false"]
    run = job("specdec.run", *overrides, f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    auto = results["auto"]
    assert results["k"] == "auto" and results["k_chosen"] == auto["k"] in (0, 1, 2)
    assert sorted(auto["predicted_speedup"]) == ["1", "2"] and auto["prompts"] == 2  # one held out per source
    assert f"drafter.k=auto chose k={auto['k']}" in run.stdout
    assert results["greedy_mismatches"] == 0 and len(list((tmp_path / "logs").glob("*.json"))) == 1
    # a margin no lookahead reaches: plain decoding, decoded once and reported as both sides (the log reused)
    plain = job("specdec.run", *overrides, "auto.margin=100", f"hydra.run.dir={tmp_path}/plain", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-2000:]
    results = json.loads((tmp_path / "plain" / "results.json").read_text())
    assert results["k_chosen"] == 0 and results["decode_speedup"] == 1.0
    assert results["wall_time_s"] == results["baseline_wall_time_s"]


def test_an_auto_run_shows_its_choice_in_the_sweep_summary(tmp_path):
    from specdec import report

    run = {"status": "ok", "drafter": "eagle", "k": "auto", "k_chosen": 0, "temperature": 0.0, "acceptance_rate": None,
           "mean_accepted_length": 1.0, "speedup": 1.0, "per_category": {}, "lossy": False}
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "results.json").write_text(json.dumps(run))
    paths = report.write_summary(tmp_path, report.collect_runs(tmp_path))
    md = paths["md"].read_text()
    assert "| 0 | eagle (k=auto) | 0 |" in md and "k=auto: a run marked so chose its k" in md
    summary = report.load_summary(paths["csv"])
    assert bool(summary["k_auto"].iloc[0]) and summary["k"].iloc[0] == 0


def test_tree_sizes_are_compared_by_one_cost_model_measured_once(models, tmp_path, monkeypatch):
    """A tree's sizes are logged a pass each but timed by one cost model measured for all of them in one session
    (replay.cache.shared_costs: each log measured alone gave one machine's plain step 7.9-10.7 ms, and the largest
    prediction won on that noise); the model is kept, so a second choice measures nothing."""
    from helpers import PATHS, random_heads

    from specdec.drafters.medusa import MedusaDrafter
    from specdec.replay import cache
    from specdec.replay.simulate import batched_speedup

    target = models[0]
    drafter = MedusaDrafter(random_heads(scale=1.0), target.lm_head.weight, PATHS)
    planted = CostModel({w: 1.0 + 0.01 * w for w in range(1, 10)}, {k: 0.01 for k in range(1, 9)},
                        {k: 0.0 for k in range(1, 9)}, machine=THIS_MACHINE)
    calls = []

    def measure(target, drafter, prompts, **options):
        calls.append(options)
        return planted

    monkeypatch.setattr(cache, "measure", measure)
    settings = AutoSettings(tree=True, ks=(3, 5, 8), max_new_tokens=NEW, seeds=1, margin=0.05, log_dir=tmp_path)
    choice = choose_lookahead(target, drafter, PROMPTS, settings, batch_size=1, eos=[])
    assert len(calls) == 1 and list(calls[0]["ks"]) == [3, 5, 8] and list(calls[0]["widths"]) == list(range(1, 10))
    for k, path in zip((3, 5, 8), choice.logs):
        log = ReplayLog.load(path)
        assert log.cost_model(1) is None  # the logs keep no cost model of their own
        assert choice.predicted[k] == batched_speedup(log.timed_by(planted), k, 1)
    again = choose_lookahead(target, drafter, PROMPTS, settings, batch_size=1, eos=[])
    assert len(calls) == 1 and again.predicted == choice.predicted


def test_a_speculative_steps_host_work_is_at_least_plain_decodings(models):
    """The live runs' host work per step is floored at plain decoding's, which a speculative step includes (a
    smaller figure is the clock's noise: one was measured negative). A verify model that reads wide blocks as far
    slower than they ran drives the raw figure below plain decoding's, so the floor is what holds it."""
    from specdec.replay.costs import loop_times

    target, drafter = models
    slow_wide = CostModel({1: 0.0, 5: 10.0})  # blocks of 2-5 tokens read as seconds: the raw host term goes negative
    _, host, plain_host, _ = loop_times(target, drafter, [PROMPTS[:1]], [1, 2, 3], slow_wide, new_tokens=8)
    assert plain_host > 0 and all(t == plain_host for t in host.values())


def test_a_drafters_once_a_generation_work_is_kept_apart_from_its_steps(models):
    """A drafter whose first proposal of a generation reads the prompt (a cross-vocabulary draft's catch-up, planted
    here as 0.3 s of sleep) is timed as that once, not spread over a short live run's few steps (which had read such a
    draft's step several times too slow, and k=auto chose plain decoding for a drafter that paid). The replay counts
    it once a generation."""
    import time

    from specdec.drafters.base import DrafterWrapper
    from specdec.replay import log_proposals
    from specdec.replay.costs import loop_times
    from specdec.replay.simulate import replay_prompt

    class ReadsThePrompt(DrafterWrapper):
        def start(self, state):
            self.inner.start(state)
            self.first = True

        def propose(self, state, k):
            if self.first:
                time.sleep(0.3)
                self.first = False
            return self.inner.propose(state, k)

    target, _ = models
    drafter = ReadsThePrompt(NgramDrafter(min_ngram=1))
    verify = CostModel({1: 0.0, 5: 0.0})
    draft, _, _, setup = loop_times(target, drafter, [PROMPTS[:1], PROMPTS[1:2]], [1, 2], verify, new_tokens=8)
    assert 0.25 < setup < 0.45 and all(t < 0.05 for t in draft.values()), (setup, draft)
    log = log_proposals(target, NgramDrafter(min_ngram=1), PROMPTS[:1], k_max=2, max_new_tokens=NEW, eos_token_id=[])
    costs = CostModel({1: 1.0, 3: 1.0}, {2: 0.0}, {2: 0.0}, 0.0, setup_s=5.0)
    once, never = (replay_prompt(log.prompts[0], 2, max_new_tokens=NEW, eos=[], costs=c)
                   for c in (costs, CostModel({1: 1.0, 3: 1.0}, {2: 0.0}, {2: 0.0}, 0.0)))
    assert once.wall_time_s == pytest.approx(never.wall_time_s + 5.0) and once.drafter_time_s == pytest.approx(5.0)


def test_a_cost_model_kept_without_the_once_a_generation_term_is_measured_again(models, tmp_path):
    """A log's cost model measured before setup_s existed spread a drafter's once-a-generation work over its steps:
    the next run measures it again rather than choosing by it."""
    target, drafter = models
    options = dict(k_max=2, max_new_tokens=8, eos_token_id=[], directory=tmp_path, costs=True, tree=False)
    _, path, _ = cached_log(target, drafter, PROMPTS[:1], **options)
    data = json.loads(path.read_text())
    del data["costs"]["1"]["setup_s"]
    path.write_text(json.dumps(data))
    log, _, from_disk = cached_log(target, drafter, PROMPTS[:1], **options)
    assert not from_disk and "setup_s" in json.loads(path.read_text())["costs"]["1"]
