"""The key test of replay (issue 47): on the real target, greedy, the replayed τ (and α per position, every count)
equals live :func:`~specdec.speculative_generate` runs' exactly: chains K = 1..8 with n-gram and with the shipped
draft model, and the default trees of EAGLE and Medusa (their shipped drafters and configs), on the same prompts.

The comparison was shown to catch planted bugs (2026-11-26, planted by hand in specdec/replay/simulate.py and
removed): stepping one token too far failed all four drafters; a chain read one draft too long failed n-gram and the
draft model (EAGLE's and Medusa's trees do not read it); tests/replay/test_replay.py lists more. Here it guards what tiny models cannot show: that the real drafters' proposals depend on the committed prefix alone, within
the float noise of forwards of other widths (specdec/replay/log.py's docstring). At T=1 (slow) the replayed τ is
compared with the mean over live runs.
"""

from __future__ import annotations

import pytest
import torch

from specdec import load_drafter, speculative_generate
from specdec.replay import log_proposals, replay

pytestmark = pytest.mark.real_model

NEW = 32
COUNTS = ("verify_steps", "verified_tokens", "proposed_tokens", "accepted_per_position", "proposed_per_position",
          "new_tokens", "tree_steps")


@pytest.mark.parametrize("name", ["ngram", pytest.param("draft_model", marks=pytest.mark.slow), "eagle", "medusa"])
def test_replayed_tau_equals_live(real_target, real_prompts, name):
    model, tokenizer = real_target
    prompts = real_prompts[:4]
    drafter = load_drafter(name, model, tokenizer)
    tree = name in ("eagle", "medusa")
    k_max = drafter.config.k if tree else 8
    log = log_proposals(model, drafter, prompts, k_max=k_max, max_new_tokens=NEW, tokenizer=tokenizer)
    assert log.tree == tree
    for k in [k_max] if tree else range(1, k_max + 1):
        for prompt, logged, replayed in zip(prompts, log.prompts, replay(log, k)):
            live = speculative_generate(model, drafter, torch.tensor([prompt]), k=k, max_new_tokens=NEW)
            assert live.sequences[0] == logged.continuation[:len(live.sequences[0])]
            assert replayed.mean_accepted_length == live.stats.mean_accepted_length, (name, k, prompt[:8])
            assert {c: getattr(replayed, c) for c in COUNTS} == {c: getattr(live.stats, c) for c in COUNTS}


@pytest.mark.slow
@pytest.mark.parametrize("name, options", [("ngram", {}), ("eagle", {"tree": False})], ids=["ngram", "eagle_chain"])
def test_sampled_replay_is_near_the_live_mean(real_target, real_prompts, name, options):
    """T=1, K=2 on 6 prompts: the replay over 8 sampled continuations per prompt within 8% of the mean over 8 live
    runs per prompt (experiments/README.md, replay at T=1: within 3.3% with 16 + 16 on 8 prompts; this is a
    smaller, noisier copy of that measurement)."""
    from specdec.decode.metrics import total

    model, tokenizer = real_target
    drafter = load_drafter(name, model, tokenizer, **options)
    new, k = 24, 2
    log = log_proposals(model, drafter, real_prompts, k_max=k, max_new_tokens=new, tokenizer=tokenizer,
                        temperature=1.0, seeds=8)
    generator, live = torch.Generator(), []
    for i, prompt in enumerate(real_prompts):
        for seed in range(8):
            generator.manual_seed(1000 * seed + i)
            live.append(speculative_generate(model, drafter, torch.tensor([prompt]), k=k, max_new_tokens=new,
                                             temperature=1.0, generator=generator).stats)
    replayed, measured = total(replay(log, k)).mean_accepted_length, total(live).mean_accepted_length
    assert replayed == pytest.approx(measured, rel=0.08), (name, replayed, measured)
