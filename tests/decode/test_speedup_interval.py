"""The speedup's noise: a seeded per-prompt bootstrap interval of the same statistic the run reports (total tokens
over total time, speculative over plain), none below 3 prompts."""

from __future__ import annotations

import math

import pytest

from specdec.decode.metrics import MIN_PROMPTS, DecodeStats, speedup_interval, speedup_intervals, summarize, total


def stats(tokens: int, seconds: float, prefill_s: float = 0.1) -> DecodeStats:
    return DecodeStats(new_tokens=tokens, prefill_tokens=1, wall_time_s=seconds, prefill_time_s=prefill_s,
                       target_forwards=tokens, target_time_s=seconds)


def test_the_interval_is_seeded_holds_the_runs_speedup_and_widens_with_noisier_prompts():
    base = [stats(64, 2.0) for _ in range(8)]
    steady = [stats(64, 1.6 + 0.01 * i) for i in range(8)]  # every prompt ~1.2x
    noisy = [stats(64, t) for t in (0.8, 2.5, 1.0, 2.2, 1.2, 2.0, 1.5, 1.6)]
    low, high = speedup_interval(steady, base)
    assert (low, high) == speedup_interval(steady, base)  # seeded
    assert low <= summarize(total(steady), total(base), 4, 8)["speedup"] <= high
    noisy_low, noisy_high = speedup_interval(noisy, base)
    assert noisy_high - noisy_low > 5 * (high - low)
    assert speedup_interval(noisy, base, seed=1) != (noisy_low, noisy_high)


def test_the_decode_only_interval_leaves_the_prefill_out():
    base = [stats(33, 2.0, prefill_s=1.0) for _ in range(4)]
    spec = [stats(33, 1.5, prefill_s=1.0) for _ in range(4)]  # decode: 32 tokens in 0.5 s against 1.0 s
    assert speedup_interval(spec, base) == pytest.approx((2.0 / 1.5, 2.0 / 1.5))
    assert speedup_interval(spec, base, decode_only=True) == pytest.approx((2.0, 2.0))


def test_fewer_than_three_prompts_have_no_interval_and_are_marked():
    two = [stats(64, 1.0), stats(64, 1.2)]
    assert MIN_PROMPTS == 3 and all(math.isnan(x) for x in speedup_interval(two, two))
    assert speedup_intervals(two, two) == {"speedup_interval": None, "decode_speedup_interval": None,
                                           "few_prompts": True}
    three = two + [stats(64, 1.1)]
    assert speedup_intervals(three, three)["speedup_interval"] == pytest.approx([1.0, 1.0])
    with pytest.raises(ValueError, match="pairs each prompt's two runs"):
        speedup_interval(three, two)
