"""``compare``: speculative against plain decoding measured as the main job measures them (an untimed warm-up, then
each prompt both ways with the same seed), the speedup with its interval over the prompts."""

from __future__ import annotations

import pytest
import torch

from specdec import compare, load_drafter


def test_compare_warms_up_then_decodes_each_prompt_both_ways(tiny_target):
    drafter = load_drafter("ngram", tiny_target)
    prompts = [[5, 6, 7, 5, 6], torch.tensor([9, 8, 9, 8]), [1, 2, 3, 1, 2, 3]]
    result = compare(tiny_target, drafter, prompts, max_new_tokens=10)
    assert len(result.speculative) == len(result.plain) == 3 and result.same_output
    assert all(len(out.sequences[0]) == 10 for out in result.speculative)
    assert result.stats.verify_steps > 0 and result.speedup > 0
    low, high = result.speedup_interval
    assert low <= high and str(result).startswith(f"ngram, k={result.stats.k} (chain drafts), 3 prompts: τ ")
    assert "speedup vs plain decoding" in str(result) and "(measured wall clock, end to end; 95% interval" in str(result)
    assert str(result).endswith("same output as plain decoding: True")
    assert "no interval: 1 prompts, 3 needed" in str(compare(tiny_target, drafter, prompts[:1], max_new_tokens=4))
    with pytest.raises(ValueError, match="at least one prompt"):
        compare(tiny_target, drafter, [], max_new_tokens=4)
