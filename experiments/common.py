"""What the experiments share (not a test; imports no dataset code, so it runs where only torch and specdec are
installed): the one argument parser every benchmark starts from, argparse types, drafter-config overrides, the
side-by-side timing loop and a median timer.

Scripts import it as ``experiments.common``: each puts the repository root on ``sys.path`` once, at the top,
so ``python experiments/<folder>/<script>.py`` and ``python -m experiments.<folder>.<script>`` both work."""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import sys
import time
import traceback

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


def non_negative_float(text: str) -> float:
    """argparse type: a number >= 0 (a temperature)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def spec_type(pattern: str, form: str):
    """argparse type: a string matching ``pattern`` (a regular expression), else an error showing ``form``."""
    def check(text: str) -> str:
        if not re.fullmatch(pattern, text):
            raise argparse.ArgumentTypeError(f"expected {form}, got {text!r}")
        return text
    return check


def benchmark_parser(doc: str, *, source: str | list[str] = "mtbench", prompts: int = 24, new: int = 128,
                     out: str = "benchmarks", temperature: bool = False, prompt_file: bool = False,
                     ) -> argparse.ArgumentParser:
    """The parser every benchmark starts from, holding the arguments they share: ``--source`` (a list when
    ``source`` is one: ``--source mtbench humaneval``, ``--sources`` too), ``--prompts``, ``--new``, ``--out``;
    ``--temperature`` for the benchmarks that sample, ``--prompt-file`` for those that run where the datasets are
    not installed. Each benchmark adds its own arguments to it."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    common = ap.add_argument_group("arguments every benchmark takes")
    if isinstance(source, list):
        common.add_argument("--source", "--sources", dest="sources", nargs="+", default=source,
                            help="prompt sources (specdec.jobs.data: mtbench, humaneval, wikipedia, shakespeare, "
                                 "stdlib, a .jsonl file)")
    else:
        common.add_argument("--source", default=source,
                            help="prompt source (specdec.jobs.data: mtbench, humaneval, wikipedia, shakespeare, "
                                 "stdlib, a .jsonl file)")
    common.add_argument("--prompts", type=positive_int, default=prompts,
                        help="prompts (per source)" if isinstance(source, list) else "prompts")
    if prompt_file:
        common.add_argument("--prompt-file", default=None,
                            help="a JSON list of token-id lists instead of --source (benchmarks/gpu.py "
                                 "--dump-prompts or gpu/kit.py pack writes one): no datasets needed")
    common.add_argument("--new", type=positive_int, default=new, help="max new tokens per prompt")
    if temperature:
        common.add_argument("--temperature", type=non_negative_float, default=0.0,
                            help="0: greedy; above: each method samples from its own generator, seeded per prompt")
    common.add_argument("--out", default=out, help="directory the results (JSON and a Markdown table) go to")
    return ap


def parse_overrides(spec: str, config: type) -> dict:
    """"k=16,depth=7,tree=false" -> {"k": 16, "depth": 7, "tree": False}, each key a field of ``config``."""
    out = {}
    fields = {f.name for f in dataclasses.fields(config)}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        if key not in fields:
            raise SystemExit(f"{spec!r}: {key!r} is not a field of {config.__qualname__}; use KEY=VALUE with KEY in "
                             f"{sorted(fields)}")
        out[key] = {"true": True, "false": False, "null": None}.get(value.lower(), value)
        if isinstance(out[key], str):
            try:
                out[key] = int(value)
            except ValueError:
                try:
                    out[key] = float(value)
                except ValueError:
                    pass
    return out


WARM_UP_LENGTHS = (32, 33)  # prompt lengths of side_by_side's untimed warm-up


def side_by_side(methods: dict, prompts: list[torch.Tensor], run, references: list | None = None,
                 failed: dict | None = None) -> tuple[dict, dict, dict, dict]:
    """Each prompt runs every method in turn (machine drifts hit all alike) after an untimed warm-up (the first prompt
    cut to each of :data:`WARM_UP_LENGTHS`: Triton specialises a kernel on whether its integers divide by 16, and a
    specialisation first met by a timed run is compiled inside it).
    ``methods``: name -> (drafter or None, k); ``run(drafter, k, ids)`` -> GenerationOutput; the first method is
    the reference. Returns per method: seconds (graph captures left out: their time is the stats' ``capture_time_s``),
    new tokens, merged DecodeStats, outputs differing from the reference;
    ``references``, if given a list, receives the reference's new tokens per prompt.
    ``failed``, if given a dict, keeps the run going past a method that raises (a path never run before, on a
    borrowed GPU): the method's traceback goes there under its name, it leaves ``methods`` and the results, and
    the others go on. The reference may not fail."""
    methods = dict(methods)

    def attempt(name, drafter, k, ids):
        if failed is None or name == next(iter(methods)):
            return run(drafter, k, ids)
        try:
            return run(drafter, k, ids)
        except Exception:  # noqa: BLE001 - recorded and reported; the other methods' rows are still measured
            failed[name] = traceback.format_exc()
            print(f"{name} failed, left out:\n{failed[name]}", file=sys.stderr, flush=True)
            del methods[name]
            return None

    for name, (drafter, k) in list(methods.items()):  # warm-up, untimed: a length a multiple of 16 and one not,
        for cut in WARM_UP_LENGTHS:  # so that Triton's kernels are compiled for both (it specialises on that)
            attempt(name, drafter, k, prompts[0][:, :cut])
    seconds, tokens, stats = dict.fromkeys(methods, 0.0), dict.fromkeys(methods, 0), {}
    mismatches = dict.fromkeys(methods, 0)
    with torch.no_grad():
        for ids in prompts:
            reference = None
            for name, (drafter, k) in list(methods.items()):
                start = time.perf_counter()
                out = attempt(name, drafter, k, ids)
                if out is None:
                    for table in (seconds, tokens, stats, mismatches):
                        table.pop(name, None)
                    continue
                seconds[name] += time.perf_counter() - start - out.stats.capture_time_s  # graph captures: one-off
                tokens[name] += len(out.sequences[0])
                stats[name] = out.stats if name not in stats else stats[name].merge(out.stats)
                if reference is None:
                    reference = out.sequences
                    if references is not None:
                        references.append(out.sequences[0])
                mismatches[name] += out.sequences != reference
    return seconds, tokens, stats, mismatches


def median_ms(fn, reps: int) -> float:
    """The median of ``reps`` timed calls of ``fn``, in ms, after one untimed call."""
    fn()  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def until_eos(row: list[int], eos: list[int]) -> list[int]:
    """transformers' generated row up to its first stop token (kept, as specdec's sequences keep it), padding
    dropped."""
    for i, token in enumerate(row):
        if token in eos:
            return row[: i + 1]
    return row
