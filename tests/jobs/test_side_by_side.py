"""experiments/common.side_by_side: every prompt through every method in turn; on a borrowed GPU a method that
raises (a path never run there before) is left out and named, and the others are still measured."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from experiments.common import side_by_side


class _Stats:
    capture_time_s = 0.0

    def merge(self, other):
        return self


def _run(drafter, k, ids):
    if drafter == "breaks" and ids.shape[1] > 32:  # past the warm-up, on the first timed prompt
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    return SimpleNamespace(stats=_Stats(), sequences=[[1, 2, 3] if drafter != "differs" else [1, 2, 4]])


METHODS = {"plain": (None, 0), "breaks": ("breaks", 4), "differs": ("differs", 4), "same": ("same", 4)}
PROMPTS = [torch.zeros(1, 40, dtype=torch.long)] * 3


def test_a_method_that_raises_is_left_out_and_named_the_others_measured():
    failed = {}
    seconds, tokens, stats, mismatches = side_by_side(METHODS, PROMPTS, _run, failed=failed)
    assert list(failed) == ["breaks"] and "illegal memory access" in failed["breaks"]
    for table in (seconds, tokens, stats, mismatches):
        assert list(table) == ["plain", "differs", "same"]
    assert tokens == {"plain": 9, "differs": 9, "same": 9}
    assert mismatches == {"plain": 0, "differs": 3, "same": 0}


def test_without_a_failed_dict_an_error_stops_the_comparison():
    with pytest.raises(RuntimeError, match="illegal memory access"):
        side_by_side(METHODS, PROMPTS, _run)
