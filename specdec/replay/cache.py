"""Replay logs on disk: one file per (target, drafter config, tokenizer, prompts, max_new_tokens, sampling settings and
seeds, EOS, K_max), named by a hash of all of them, so every replay those cover reuses one logging pass.

A file is read back only after its identities are compared with the request's (:meth:`ReplayLog.check
<specdec.replay.log.ReplayLog.check>`): a log from another target, drafter, tokenizer or sampling setting is refused
with a message naming both, whatever its name says.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from specdec.drafters.base import Drafter
from specdec.jobs.io import write_text
from specdec.models.loading import cache_root, stop_token_ids
from specdec.replay.cost_model import CostModel
from specdec.replay.costs import logged_trees, measure, timed_on
from specdec.replay.log import (ReplayLog, check_replayable, drafter_identity, drafts_trees, log_key, log_proposals,
                                target_identity, tokenizer_identity)


def default_directory() -> Path:
    """Where logs are kept unless told: ``replay/`` under specdec's cache root (``$SPECDEC_CACHE``)."""
    return cache_root() / "replay"


def load_log(path: str | Path, target, drafter: Drafter, tokenizer: Any = None, k: int | None = None,
             sampling: dict | None = None) -> ReplayLog:
    """The log at ``path``, refused (:class:`~specdec.replay.log.ReplayMismatchError`) unless it was written for
    ``target``, ``drafter`` and ``tokenizer`` and holds lookahead ``k`` and ``sampling`` (temperature, top_k,
    top_p; None: not checked)."""
    log = ReplayLog.load(path)
    log.check(target=target_identity(target), drafter=drafter_identity(drafter, chain_k_free=not log.tree),
              tokenizer=tokenizer_identity(tokenizer) if log.tokenizer is not None else None, k=k, sampling=sampling,
              path=path)
    return log


def _current(costs: dict[str, Any]) -> bool:
    """Whether a kept cost model is one this specdec measures: one without ``setup_s`` spread a drafter's
    once-a-generation work over its steps (a cross-vocabulary draft's step read several times too slow), so it is
    measured again."""
    return "setup_s" in costs


def cached_log(target, drafter: Drafter, prompts: Sequence[Sequence[int]], *, k_max: int, max_new_tokens: int,
               tokenizer: Any = None, eos_token_id: int | Sequence[int] | None = None, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, seeds: int = 1, tree: bool | None = None,
               directory: str | Path | None = None, costs: bool = False, cost_batch: int = 1,
               pad_id: int = 0, timing: Any = None) -> tuple[ReplayLog, Path, bool]:
    """The log of ``drafter`` on ``prompts`` (:func:`~specdec.replay.log.log_proposals`), from ``directory`` (None:
    :func:`default_directory`) when an earlier pass wrote it, else logged now and saved there. ``tree``: a tree
    drafter (None: :func:`~specdec.replay.log.drafts_trees`). The key holds K_max: log chains at the largest K a
    sweep needs. ``costs``: measure the cost model at a batch of ``cost_batch`` rows too
    (:func:`~specdec.replay.costs.measure`: verify widths 1 .. K_max + 1, live steps at every K <= K_max, or the
    tree's; ``pad_id`` left-pads those rows) where the log has none at that batch measured on this machine (as
    :func:`~specdec.jobs.runs.machine_description` names it), and keep it in the file.
    ``temperature``, ``top_k``, ``top_p``, ``seeds``: as :func:`~specdec.replay.log.log_proposals` takes them.
    ``timing``: what the costs are measured through (None: ``target``; a GPU's run: its graphed decoder, while the
    log is taken from ``target``'s eager forwards). Returns the log, its file and whether it was read from disk."""
    check_replayable(drafter, temperature, top_k, top_p)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    tree = drafts_trees(drafter) if tree is None else tree
    eos = sorted(set(stop_token_ids(target) if eos_token_id is None else
                     [eos_token_id] if isinstance(eos_token_id, int) else eos_token_id))
    ids = (target_identity(target), drafter_identity(drafter, chain_k_free=not tree), tokenizer_identity(tokenizer))
    key = log_key(*ids, prompts, max_new_tokens, sampling, eos, k_max, seeds)
    path = Path(directory or default_directory()) / f"{ids[1]['name']}-{key}.json"
    from_disk = path.is_file()
    if from_disk:
        log = ReplayLog.load(path)
        log.check(target=ids[0], drafter=ids[1], tokenizer=ids[2], k=k_max, sampling=sampling, path=path)
    else:
        log = log_proposals(target, drafter, prompts, k_max=k_max, max_new_tokens=max_new_tokens,
                            tokenizer=tokenizer, eos_token_id=eos, tree=tree, seeds=seeds, **sampling)
    measured = log.cost_model(cost_batch)
    stale = measured is None or not _current(log.costs[str(cost_batch)])
    timing = target if timing is None else timing
    if costs and (stale or measured.machine != timed_on(timing)):
        model = measure(timing, drafter, prompts, ks=[k_max] if log.tree else range(1, k_max + 1),
                        widths=range(1, k_max + 2), trees=logged_trees(log), batch_size=cost_batch, pad_id=pad_id,
                        **sampling)
        log.costs[str(cost_batch)] = asdict(model)
        from_disk = False
    if not from_disk:
        log.save(path)
    return log, path, from_disk


def shared_costs(target, drafter: Drafter, prompts: Sequence[Sequence[int]], logs: dict[int, tuple[ReplayLog, Path]],
                 *, batch_size: int = 1, directory: str | Path | None = None, pad_id: int = 0,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, timing: Any = None) -> CostModel:
    """One cost model for every tree size of ``logs`` (size -> its log and file): verify widths 1 .. the largest size
    + 1 (under the first tree logged at each width), live steps at every size, plain decoding's step, all measured in
    one session at ``batch_size`` rows, so that the sizes are compared by the same clock (each log measured on its own
    read plain decoding's step 7.9-10.7 ms apart on one machine, and the largest prediction won on that noise). Kept
    beside the logs, keyed by their files, the batch size, the sampling settings and this machine. ``timing``: what
    the costs are measured through, as :func:`cached_log`'s."""
    timing = target if timing is None else timing
    machine = timed_on(timing)
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    what = {"logs": sorted(path.name for _, path in logs.values()), "batch_size": batch_size, "machine": machine,
            "sampling": sampling}
    key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:24]
    path = Path(directory or default_directory()) / f"costs-{key}.json"
    if path.is_file() and _current(kept := json.loads(path.read_text())):
        return CostModel.from_dict(kept)
    sizes, trees = sorted(logs), {}
    for size in sizes:
        for width, tree in logged_trees(logs[size][0]).items():
            trees.setdefault(width, tree)
    model = measure(timing, drafter, prompts, ks=sizes, widths=range(1, max(sizes) + 2), trees=trees,
                    batch_size=batch_size, pad_id=pad_id, **sampling)
    write_text(path, json.dumps(asdict(model)))  # a crash mid-write leaves no half file under the real name
    return model
