"""The self-distillation dataset: built once per configuration, stored as safetensors, reused after.

Splits: ``train`` and ``val`` (the target's answers to generated prompts, or corpus chunks, split by
``seed``), and held-out ones never trained on: ``answers_<source>`` (the target's answers to benchmark
prompts: MT-Bench, HumanEval) and ``text_<source>`` (the first ``data.skip_first`` rows of a corpus).
Each split stores its sequences back to back (:class:`Split`); what a method derives from them (labels,
pairs, windows) is computed when it loads them, so one store serves every method with the same needs.

The file carries a format tag and a fingerprint of everything it depends on; a file from another format
or configuration is refused with what to do, never silently reused or overwritten.

Several processes (``accelerate launch --num_processes N -m specdec.train ...``) share the building: each answers
every N-th batch of prompts (and runs every N-th corpus chunk) into a shard file, the main process merges the shards
in order into the one store, which then holds what one process would have built (:func:`load_or_build`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from specdec.jobs.io import read_metadata, read_tensors
from specdec.training.distill.answers import Sequence, answer_shard, text_shard
from specdec.training.distill.prompts import instruction_prompts, magpie_prompts, write_jsonl

log = logging.getLogger(__name__)
FORMAT = "specdec-distill-1"
TRAINING = "training"  # the part train and val are split from


@dataclass(frozen=True)
class DataNeeds:
    """What a training method needs stored beside the answers' tokens and final hidden states."""

    layers: tuple[int, ...] = ()  # hidden states of these layers too (0 = embeddings, as transformers counts)
    topk: int = 0  # the target's top-k next-token log-probabilities at every position (soft labels); 0 = none
    context: bool = False  # the final and the layers' hidden states at the context's positions too (EAGLE)


@dataclass
class Split:
    """Sequences back to back: sequence j holds positions ``offsets[j] .. offsets[j] + lengths[j] - 1``."""

    context: torch.Tensor  # [C] long: every sequence's context, back to back
    context_lengths: torch.Tensor  # [S] long
    tokens: torch.Tensor  # [N] long
    lengths: torch.Tensor  # [S] long
    hidden: torch.Tensor  # [N, H] float32: the final hidden state that predicted tokens[s]
    features: torch.Tensor | None = None  # [N, L, H] float32: the needed layers' hidden states
    topk_ids: torch.Tensor | None = None  # [N, k] long: the target's k likeliest tokens at s
    topk_logprobs: torch.Tensor | None = None  # [N, k] float32: their log-probabilities
    # with DataNeeds.context: at the context positions before the one that predicted tokens[0] (c - 1 per
    # sequence), the final hidden state and the layers' hidden states, back to back like ``context``
    context_hidden: torch.Tensor | None = None  # [C - S, H]
    context_features: torch.Tensor | None = None  # [C - S, L, H]

    @classmethod
    def of(cls, sequences: list[Sequence]) -> "Split":
        def cat(name: str) -> torch.Tensor | None:
            parts = [getattr(s, name) for s in sequences]
            return None if parts[0] is None else torch.cat(parts)

        return cls(cat("context"), torch.tensor([s.context.numel() for s in sequences]), cat("tokens"),
                   torch.tensor([s.tokens.numel() for s in sequences]), cat("hidden"), cat("features"),
                   context_hidden=cat("context_hidden"), context_features=cat("context_features"))


def _fingerprint(cfg: Any, needs: DataNeeds) -> str:
    """What the stored data depends on: the target, the seed, the data and held-out settings (a prompts file's
    content too), the needs. Without a prompts file, and with features read one answer at a time, it is what it
    was before those options existed, so stores built then are still read."""
    data = dict(vars(cfg.data))
    if data.get("feature_batch", 1) == 1:
        data.pop("feature_batch", None)
    found = {"target": cfg.target.name, "seed": cfg.seed, "data": data, "eval": vars(cfg.eval), "needs": asdict(needs)}
    if data.get("prompts_file") is None:
        data.pop("prompts_file", None)
    else:
        found["prompts_sha256"] = hashlib.sha256(Path(data["prompts_file"]).read_bytes()).hexdigest()
    return json.dumps(found, sort_keys=True, default=list)


def data_key(cfg: Any, needs: DataNeeds) -> str:
    """A short digest of what the stored data depends on (:func:`_fingerprint`): checkpoints record it, so a run
    resumed where its data had to be built again (a fresh GPU machine) is refused if that data was configured
    otherwise."""
    return hashlib.sha256(_fingerprint(cfg, needs).encode()).hexdigest()[:16]


def split_name(kind: str, source: str) -> str:
    """The held-out split of ``source`` (``answers_mtbench``, ``text_wikipedia``); a file source by its stem
    (``mtbench.jsonl`` -> ``answers_mtbench``), since the stored tensors' names end at the first dot."""
    if source.endswith((".jsonl", ".json")):
        source = Path(source).stem
    return f"{kind}_{source}"


def training_shard(cfg: Any, target, tokenizer, needs: DataNeeds, prompts_path: Path | None,
                   shard: tuple[int, int] = (0, 1)) -> dict[int, Sequence]:
    """This process's share (``shard`` = (index, count)) of the sequences ``train`` and ``val`` are split from
    (``data.mode``: self_distill or text), by their index. Every process makes the same prompt rows (a prompts
    file, the generated instructions, the target's own Magpie prompts); ``prompts_path`` keeps them."""
    from specdec.jobs.data import encode_prompt, load_prompts

    data = cfg.data
    if data.mode == "text":
        texts = [tokenizer(r["text"])["input_ids"] for s in data.text_sources
                 for r in list(load_prompts(s, seed=0))[data.skip_first:]]
        return text_shard(target, texts, data.text_seq_len, needs.layers, needs.context, shard)
    if data.mode != "self_distill":
        raise ValueError(f"data.mode must be 'self_distill' or 'text', got {data.mode!r}")
    num_magpie = round(data.num_prompts * data.magpie_fraction)
    rows = (file_prompts(data.prompts_file, data.num_prompts) if data.prompts_file
            else instruction_prompts(data.num_prompts - num_magpie, data.skip_first, cfg.seed))
    if num_magpie:
        rows += magpie_prompts(target, tokenizer, num_magpie, cfg.seed, data.batch_size)
        log.info("the target wrote %d prompts, e.g. %r", num_magpie, rows[-1]["text"][:200])
    if prompts_path is not None:
        write_jsonl(prompts_path, rows)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return answer_shard(target, [encode_prompt(tokenizer, r) for r in rows], data.max_new_tokens, data.batch_size,
                        pad_id, needs.layers, needs.context, shard, data.feature_batch)


def file_prompts(path: str, num: int) -> list[dict[str, str]]:
    """The first ``num`` prompt rows of the JSONL file ``path`` (``data.prompts_file``); an error naming both
    counts where it holds fewer."""
    from specdec.jobs.data import load_prompts

    rows = [dict(row) for row in load_prompts(path, limit=num)]
    if len(rows) < num:
        raise ValueError(f"data.prompts_file={path!r} holds {len(rows)} prompts, fewer than data.num_prompts={num}; "
                         f"lower data.num_prompts or write more with python -m specdec.training.distill.prompts "
                         f"--num {num} --out {path}")
    return rows


def build_parts(cfg: Any, target, tokenizer, needs: DataNeeds, prompts_path: Path | None = None,
                shard: tuple[int, int] = (0, 1)) -> dict[str, dict[int, Sequence]]:
    """This process's share (``shard`` = (index, count)) of every part the splits come from: ``training`` (split
    into ``train`` and ``val`` once merged) and each held-out split, each as {index in the part: Sequence}.
    ``prompts_path``: where to keep the generated prompts."""
    from specdec.jobs.data import encode_prompt, load_prompts

    data = cfg.data
    parts = {TRAINING: training_shard(cfg, target, tokenizer, needs, prompts_path, shard)}
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for source in cfg.eval.answer_sources:
        rows = load_prompts(source, limit=cfg.eval.limit_per_source)
        prompts = [encode_prompt(tokenizer, r) for r in rows]
        parts[split_name("answers", source)] = answer_shard(target, prompts, cfg.eval.max_new_tokens, data.batch_size,
                                                            pad_id, needs.layers, needs.context, shard,
                                                            data.feature_batch)
    for source in cfg.eval.text_sources:
        texts = [tokenizer(r["text"])["input_ids"] for r in list(load_prompts(source, seed=0))[: data.skip_first]]
        parts[split_name("text", source)] = text_shard(target, texts, data.text_seq_len, needs.layers, needs.context,
                                                       shard)
    return parts


def merge_parts(shards: list[dict[str, dict[int, Sequence]]]) -> dict[str, list[Sequence]]:
    """Every process's parts (:func:`build_parts`) as one list per part, in index order; an error where a part's
    indices do not add up to 0 .. n - 1, each once."""
    merged: dict[str, list[Sequence]] = {}
    for name in shards[0]:
        found: dict[int, Sequence] = {}
        for number, shard in enumerate(shards):
            overlap = found.keys() & shard.get(name, {}).keys()
            if overlap:
                raise ValueError(f"part {name!r}: shards 0..{number} hold sequence {min(overlap)} twice")
            found.update(shard.get(name, {}))
        if sorted(found) != list(range(len(found))):
            missing = sorted(set(range(max(found, default=-1) + 1)) - found.keys())
            raise ValueError(f"part {name!r}: the shards lack sequence(s) {missing[:5]}; build the data again")
        merged[name] = [found[i] for i in range(len(found))]
    return merged


def splits_from_parts(cfg: Any, target, parts: dict[str, list[Sequence]], needs: DataNeeds) -> dict[str, Split]:
    """The stored splits from the merged parts: ``train`` and ``val`` split from ``training`` by ``seed``, the
    held-out ones as they are; the target's top-k where ``needs`` asks."""
    seqs = parts[TRAINING]
    order = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    num_val = max(1, int(len(seqs) * cfg.data.val_fraction))
    splits = {"train": [seqs[i] for i in order[num_val:]], "val": [seqs[i] for i in order[:num_val]],
              **{name: part for name, part in parts.items() if name != TRAINING}}
    out = {name: Split.of(split) for name, split in splits.items()}
    if needs.topk:
        for split in out.values():
            split.topk_ids, split.topk_logprobs = _topk(target, split.hidden, needs.topk)
    return out


def build_splits(cfg: Any, target, tokenizer, needs: DataNeeds, prompts_path: Path | None = None,
                 ) -> dict[str, Split]:
    """Every split (see the module docstring), built by this process alone. ``prompts_path``: where to keep the
    generated prompts."""
    return splits_from_parts(cfg, target, merge_parts([build_parts(cfg, target, tokenizer, needs, prompts_path)]),
                             needs)


@torch.no_grad()
def _topk(target, hidden: torch.Tensor, k: int, chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's k likeliest next tokens and their log-probabilities, from its final hidden states [N, H]."""
    lm_head = target.get_output_embeddings()
    ids, logprobs = [], []
    for start in range(0, hidden.shape[0], chunk):
        h = hidden[start: start + chunk].to(lm_head.weight)
        top = lm_head(h).float().log_softmax(-1).topk(k, dim=-1)
        ids.append(top.indices.cpu())
        logprobs.append(top.values.cpu())
    return torch.cat(ids), torch.cat(logprobs)


_HINT = "move or delete that file to rebuild it, or use another run_name (or output_dir)"


def _check_stored(path: Path, fingerprint: str | None) -> None:
    """Raise ValueError unless ``path`` holds this format (and, given one, this ``fingerprint``)."""
    meta = read_metadata(path, what="self-distillation data file", hint=_HINT)
    if meta.get("format") != FORMAT:
        written_by = (f"format {meta['format']!r}" if "format" in meta else
                      "per-head Medusa labels, as `python -m specdec.train_medusa` wrote before the training package")
        raise ValueError(f"{str(path)!r} holds self-distillation data in another layout ({written_by}); this "
                         f"version reads {FORMAT!r} only: move or delete that file to rebuild it (the target "
                         f"answers the prompts again), or use another run_name (or output_dir)")
    if fingerprint is not None and meta.get("fingerprint") != fingerprint:
        raise ValueError(f"{str(path)!r} holds data built with another configuration; use another run_name "
                         f"(or delete {str(path.parent)!r} to start over)")


def load_splits(path: Path) -> dict[str, Split]:
    """Every split stored at ``path`` (a file :func:`load_or_build` wrote)."""
    _check_stored(path, None)
    tensors = read_tensors(path, what="self-distillation data file", hint=_HINT)
    names = sorted({key.split(".")[0] for key in tensors})
    return {name: Split(**{f.name: tensors.get(f"{name}.{f.name}") for f in fields(Split)}) for name in names}


def load_or_build(cfg: Any, target, tokenizer, needs: DataNeeds, path: Path, accelerator=None) -> dict[str, Split]:
    """The splits stored at ``path`` if they were built from this configuration; else built and stored
    (atomically: a temporary file, then a rename). Raises ValueError for a file of another format or
    configuration. With an ``accelerator`` of several processes, each builds its share (:func:`build_parts`:
    batches of answers, chunks of text) into a shard file beside ``path`` (kept until the merge, so a rerun
    builds only the shards missing), the main process merges them into the store, and every process reads it:
    the store holds what one process builds."""
    fingerprint = _fingerprint(cfg, needs)
    if path.is_file():
        _check_stored(path, fingerprint)
        return load_splits(path)
    count = accelerator.num_processes if accelerator is not None else 1
    start = time.perf_counter()
    prompts_path = path.with_name("prompts.jsonl")
    if count == 1:
        splits = build_splits(cfg, target, tokenizer, needs, prompts_path=prompts_path)
        _save_store(path, splits, fingerprint, time.perf_counter() - start, 1)
        return splits
    index = accelerator.process_index
    mine = _shard_path(path, index, count)
    if not (mine.is_file() and _shard_fingerprint(mine) == fingerprint):
        parts = build_parts(cfg, target, tokenizer, needs, prompts_path if index == 0 else None, (index, count))
        _save_shard(mine, parts, fingerprint)
        log.info("process %d of %d built its share of the data in %.1f s", index, count, time.perf_counter() - start)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        shards = [_load_shard(_shard_path(path, i, count)) for i in range(count)]
        splits = splits_from_parts(cfg, target, merge_parts(shards), needs)
        _save_store(path, splits, fingerprint, time.perf_counter() - start, count)
        for i in range(count):
            _shard_path(path, i, count).unlink()
    accelerator.wait_for_everyone()
    return splits if accelerator.is_main_process else load_splits(path)


def _save_store(path: Path, splits: dict[str, Split], fingerprint: str, seconds: float, processes: int) -> None:
    tensors = {f"{name}.{f.name}": getattr(split, f.name).contiguous() for name, split in splits.items()
               for f in fields(Split) if getattr(split, f.name) is not None}
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata={"format": FORMAT, "fingerprint": fingerprint, "build_s": f"{seconds:.1f}",
                                           "processes": str(processes)})
    tmp.replace(path)


def _shard_path(path: Path, index: int, count: int) -> Path:
    return path.with_name(f".{path.stem}.shard{index}of{count}.safetensors")


def _save_shard(path: Path, parts: dict[str, dict[int, Sequence]], fingerprint: str) -> None:
    """One process's parts, each sequence's tensors under ``<part>.<index>.<field>``, atomically."""
    tensors = {f"{name}.{i}.{f.name}": getattr(seq, f.name).contiguous() for name, part in parts.items()
               for i, seq in part.items() for f in fields(Sequence) if getattr(seq, f.name) is not None}
    tmp = path.with_name(f"{path.name}.tmp")
    save_file(tensors, str(tmp), metadata={"format": FORMAT, "fingerprint": fingerprint,
                                           "parts": json.dumps(sorted(parts))})
    tmp.replace(path)


def _shard_fingerprint(path: Path) -> str | None:
    return read_metadata(path, what="self-distillation shard", hint=_HINT).get("fingerprint")


def _load_shard(path: Path) -> dict[str, dict[int, Sequence]]:
    parts: dict[str, dict[int, dict[str, torch.Tensor]]] = {
        name: {} for name in json.loads(read_metadata(path, what="self-distillation shard", hint=_HINT)["parts"])}
    for key, tensor in read_tensors(path, what="self-distillation shard", hint=_HINT).items():
        name, index, field_name = key.split(".")
        parts[name].setdefault(int(index), {})[field_name] = tensor
    return {name: {i: Sequence(**values) for i, values in part.items()} for name, part in parts.items()}


def build_seconds(path: Path) -> float | None:
    """How long the stored data took to build."""
    value = read_metadata(path, what="self-distillation data file", hint=_HINT).get("build_s")
    return None if value is None else float(value)


def build_processes(path: Path) -> int:
    """How many processes built the stored data (1 for a store written before that was recorded)."""
    return int(read_metadata(path, what="self-distillation data file", hint=_HINT).get("processes", 1))
