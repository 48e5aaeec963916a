"""The benchmarks' shared loop: each prompt runs every method in turn (not a test; imports no dataset code,
so it runs where only torch and specdec are installed)."""

from __future__ import annotations

import argparse
import re
import time

import torch


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a count of prompts, tokens, ...)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def spec_type(pattern: str, form: str):
    """argparse type: a string matching ``pattern`` (a regular expression), else an error showing ``form``."""
    def check(text: str) -> str:
        if not re.fullmatch(pattern, text):
            raise argparse.ArgumentTypeError(f"expected {form}, got {text!r}")
        return text
    return check


def side_by_side(methods: dict, prompts: list[torch.Tensor], run, references: list | None = None,
                 ) -> tuple[dict, dict, dict, dict]:
    """Each prompt runs every method in turn (machine drifts hit all alike) after an untimed warm-up.
    ``methods``: name -> (drafter or None, k); ``run(drafter, k, ids)`` -> GenerationOutput; the first method is
    the reference. Returns per method: seconds (graph captures left out: their time is the stats' ``capture_time_s``),
    new tokens, merged DecodeStats, outputs differing from the reference;
    ``references``, if given a list, receives the reference's new tokens per prompt."""
    for drafter, k in methods.values():  # warm-up, untimed
        run(drafter, k, prompts[0][:, :32])
    seconds, tokens, stats = dict.fromkeys(methods, 0.0), dict.fromkeys(methods, 0), {}
    mismatches = dict.fromkeys(methods, 0)
    with torch.no_grad():
        for ids in prompts:
            reference = None
            for name, (drafter, k) in methods.items():
                start = time.perf_counter()
                out = run(drafter, k, ids)
                seconds[name] += time.perf_counter() - start - out.stats.capture_time_s  # graph captures: one-off
                tokens[name] += len(out.sequences[0])
                stats[name] = out.stats if name not in stats else stats[name].merge(out.stats)
                if reference is None:
                    reference = out.sequences
                    if references is not None:
                        references.append(out.sequences[0])
                mismatches[name] += out.sequences != reference
    return seconds, tokens, stats, mismatches
