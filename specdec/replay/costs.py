"""The cost model a replay predicts time with, measured on this machine at one batch size: the target's verify time
per block width, and what a live step spends besides.

- **verify**: the target's forward over a block of w tokens per row (the last token and w − 1 drafts) after a
  prompt, for each width asked (the median of a few repeats), as the decode loop runs it: under a tree's mask where
  a tree of that size was logged (the first such shape), capturing the drafter's feature layers; width 1 is a plain
  step.
- **draft** and **host**, from short live generations per lookahead K (a chain's K, a tree's size) on a few of the
  prompts (their acceptance sets how much a drafter does between forwards), after a warm-up: the drafter's seconds
  per step (proposing and observing, as the loop times them), and the rest of the step beyond the verify forward of
  its mean width (the acceptance rule, the one sync, emitting and committing: the loop's host work), at least plain
  decoding's, which it includes. Plain decoding's host work likewise (``plain_host_s``). What the drafter does once a
  generation (its start; its first proposal's excess over the median one: a draft model reading the prompt) is kept
  apart (``setup_s``), not spread over the few steps of a short live run.

A replayed run is then timed as the live loop would spend it: ``setup`` once, then per verify step,
``verify[width]`` + ``draft[K]`` + ``host[K]``; plain decoding, ``verify[1]`` + ``plain_host`` per token. No
prefill. At a batch of B rows every figure is a step of the whole batch: a replay at batch 1's acceptance timed by
them predicts batch B's speedup (each row accepting as it would alone: for trees, whose shape a batch's rows share,
an optimistic guess).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Sequence

import torch

from specdec.drafters.base import DecodeState, Drafter, DrafterWrapper, Proposal
from specdec.models import as_decoder
from specdec.replay.cost_model import CostModel
from specdec.replay.log import ReplayLog, constant_length
from specdec.verify.tree import Tree

REPEATS = 5
LIVE_TOKENS = 32  # new tokens per row of each live generation the draft and host times come from
SPREAD = 4  # prompts those generations decode (at least a batch), evenly spaced through the prompts


def verify_times(target, prompt: Sequence[int], widths: Sequence[int], repeats: int = REPEATS, *,
                 trees: dict[int, Tree] | None = None, capture: tuple[int, ...] = (),
                 batch_size: int = 1) -> dict[int, float]:
    """The median seconds of the target's forward over ``w`` tokens per row after ``prompt`` (in its cache, in
    each of ``batch_size`` rows), for each of ``widths``: under ``trees[w]``'s mask where given (a tree of w − 1
    nodes), returning the ``capture`` layers' features. The block is written past the committed prompt and never
    committed, so every repeat reads the same cache."""
    trees = trees or {}
    decoder = as_decoder(target)
    device = decoder.device
    ids = torch.as_tensor(list(prompt), dtype=torch.long, device=device)[None].expand(batch_size, -1)  # [B, S]
    length = ids.shape[1]
    cache = decoder.new_cache(batch_size, length + max(widths) + 1,
                              torch.zeros(batch_size, dtype=torch.long, device=device))
    times = {}
    with torch.no_grad():
        decoder(ids, cache, kv_len=length, last_only=True)
        cache.commit(torch.full((batch_size,), length, device=device))
        for width in widths:
            block = ids[:, -1:].expand(batch_size, width).contiguous()  # [B, w]: the tokens do not change the cost
            tree = trees.get(width)
            shape = {} if tree is None else {"tree_mask": tree.mask.to(device), "depths": tree.depths.to(device)}
            decoder(block, cache, kv_len=length + width, capture=capture, **shape)  # a first call packs what it packs
            runs = []
            for _ in range(repeats):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
                decoder(block, cache, kv_len=length + width, capture=capture, **shape)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                runs.append(time.perf_counter() - start)
            times[width] = statistics.median(runs)
    return times


class _Widths(DrafterWrapper):
    """Counts the block widths a live run verifies (the last token and the proposal's tokens), and times what the
    drafter does once a generation (its start, and its first proposal's excess over the others': a draft model
    reading the prompt) apart from its steps."""

    def __init__(self, inner: Drafter):
        super().__init__(inner)
        self.reset()

    def reset(self) -> None:
        """Forget what was counted and timed (a new K's runs)."""
        self.widths: list[int] = []
        self.starts: list[float] = []  # seconds of each generation's start
        self.firsts: list[float] = []  # seconds of each generation's first proposal
        self.others: list[float] = []  # seconds of every later proposal
        self.fresh = False

    def start(self, state: DecodeState) -> None:
        began = time.perf_counter()
        self.inner.start(state)
        self.starts.append(time.perf_counter() - began)
        self.fresh = True

    def propose(self, state: DecodeState, k: int) -> Proposal:
        began = time.perf_counter()
        proposal = self.inner.propose(state, k)
        (self.firsts if self.fresh else self.others).append(time.perf_counter() - began)
        self.fresh = False
        self.widths.append(1 + proposal.tokens.shape[1])
        return proposal

    def one_off(self) -> float:
        """Seconds of once-a-generation work timed so far: the starts, and each first proposal beyond a typical one."""
        typical = statistics.median(self.others) if self.others else 0.0
        return sum(self.starts) + sum(max(0.0, first - typical) for first in self.firsts)


def loop_times(target, drafter: Drafter, batches: Sequence[Sequence[Sequence[int]]], ks: Sequence[int],
               verify: CostModel, *, new_tokens: int = LIVE_TOKENS, pad_id: int = 0,
               **sampling: Any) -> tuple[dict[int, float], dict[int, float], float, float]:
    """From live generations of ``new_tokens`` per row over each of ``batches`` (prompts decoded together,
    left-padded) at each of ``ks``, after a warm-up: the drafter's seconds per step (its once-a-generation work left
    out), the step's host work (its seconds beyond the drafter's and ``verify``'s forward over the step's mean block
    width, at least plain decoding's), plain decoding's host work per step, each pooled over the batches, and the
    drafter's once-a-generation seconds (a batch's; the mean over every K's generations). Sampled runs
    (``sampling``: temperature, top_k, top_p) draw from a fixed seed."""
    from specdec.decode.engine import autoregressive_generate, speculative_generate
    from specdec.jobs.data import left_pad

    device = next(target.parameters()).device
    generator = torch.Generator(device=device)
    wrapped = _Widths(drafter)

    def run(k: int | None, max_new_tokens: int) -> tuple[float, float, int]:  # decode seconds, drafter's, steps
        seconds = drafting = steps = 0.0
        for batch in batches:
            ids, mask = left_pad([list(p) for p in batch], pad_id, device)
            generator.manual_seed(0)
            options = dict(attention_mask=mask, eos_token_id=[], generator=generator, max_new_tokens=max_new_tokens,
                           **sampling)
            stats = (autoregressive_generate(target, ids, **options) if k is None else
                     speculative_generate(target, wrapped, ids, k=k, **options)).stats
            seconds += stats.wall_time_s - stats.prefill_time_s
            drafting += stats.drafter_time_s
            steps += stats.target_forwards
        return seconds, drafting, max(steps, 1)

    run(max(ks), min(8, new_tokens))  # warm-up
    draft, host, setups = {}, {}, []
    for k in ks:
        wrapped.reset()
        seconds, drafting, steps = run(k, new_tokens)
        width = sum(wrapped.widths) / max(len(wrapped.widths), 1)  # a fractional width: interpolated
        one_off = min(wrapped.one_off(), drafting)
        setups.append(one_off / len(batches))
        draft[k] = (drafting - one_off) / steps
        host[k] = (seconds - one_off) / steps - draft[k] - verify.verify(width)
    run(None, min(8, new_tokens))
    seconds, _, steps = run(None, new_tokens)
    plain_host = seconds / steps - verify.verify(1)
    # a speculative step does a plain step's host work and more: a smaller figure is the clock's noise (seen negative)
    return draft, {k: max(t, plain_host) for k, t in host.items()}, plain_host, sum(setups) / len(setups)


def timed_on(target) -> str:
    """The machine a cost model measured through ``target`` holds (a cost model from elsewhere is measured again):
    :func:`~specdec.jobs.runs.machine_description`'s line, and whether the target's forwards replayed graphs (a GPU
    step's cost differs by several times between eager forwards and replayed graphs)."""
    from specdec.jobs.runs import machine_description
    from specdec.models.graphs import GraphedDecoder

    described = machine_description(next(target.parameters()).device)
    return described + (", graphs replayed" if isinstance(target, GraphedDecoder) and target.enabled else "")


def measure(target, drafter: Drafter, prompts: Sequence[Sequence[int]], *, ks: Sequence[int],
            widths: Sequence[int], trees: dict[int, Tree] | None = None, batch_size: int = 1, pad_id: int = 0,
            new_tokens: int = LIVE_TOKENS, spread: int = SPREAD, **sampling: Any) -> CostModel:
    """The cost model for ``drafter`` on ``target`` (see the module docstring) at a batch of ``batch_size`` rows:
    its live steps over ``spread`` of ``prompts`` (at least a batch; evenly spaced through them, repeated when
    fewer) in batches of ``batch_size``, its verify forwards after the first prompt; ``trees``: the tree verified
    at each block width, where the drafter proposes trees; ``sampling``: the live generations' temperature, top_k,
    top_p. ``target`` may be a :class:`~specdec.models.GraphedDecoder` (what a GPU's run replays): its forwards and
    live steps are then timed as graphs replay them."""
    count = batch_size * max(1, -(-spread // batch_size))
    rows = [list(prompts[(i * len(prompts) // count) % len(prompts)]) for i in range(count)]
    batches = [rows[i: i + batch_size] for i in range(0, count, batch_size)]
    model = CostModel(verify_times(target, rows[0], sorted(set(widths) | {1}), trees=trees,
                                   capture=tuple(drafter.traits.feature_layers), batch_size=batch_size),
                      batch_size=batch_size, machine=timed_on(target))
    with constant_length(drafter):  # a draft length schedule's steps timed at each K (the replay re-enacts it)
        model.draft_s, model.host_s, model.plain_host_s, model.setup_s = loop_times(
            target, drafter, batches, ks, model, pad_id=pad_id, new_tokens=new_tokens, **sampling)
    return model


def logged_trees(log: ReplayLog) -> dict[int, Tree]:
    """The first tree of each size a log holds, by block width (nodes + 1)."""
    trees: dict[int, Tree] = {}
    for prompt in log.prompts:
        for proposed in prompt.proposals:
            if proposed.parents and len(proposed.parents) + 1 not in trees:
                trees[len(proposed.parents) + 1] = Tree.from_parents(proposed.parents)
    return trees
