"""Train Medusa heads for a frozen target (Medusa-1), reproducibly, on one CPU or many GPUs.

    python -m specdec.train_medusa                                   # the shipped heads' config (2-core CPU, ~36 min)
    python -m specdec.train_medusa data.mode=text                    # train on a text corpus instead
    python -m specdec.train_medusa target=/path/to/model run_name=mine export=heads/mine
    accelerate launch -m specdec.train_medusa ...                    # several GPUs, no code change

Rerunning the same command resumes from the latest checkpoint in ``outputs/train_medusa/<run_name>``.

1. **Data.** ``self_distill`` (default): the target's own greedy answers to prompts — labels are then
   exactly the tokens greedy verification accepts. The prompts (:mod:`specdec.medusa_prompts`) are short
   instructions in MT-Bench's eight categories, filled from local corpora (Wikipedia, Shakespeare, the
   Python standard library) and word lists, plus passages and code to continue; the first
   ``data.skip_first`` rows of each corpus and all of MT-Bench and HumanEval stay out of training, so
   benchmark runs measure held-out prompts. ``text``: chunks of a corpus. Either way the target runs once
   (no grad; a Llama-family target through specdec's own batched decode loop) and its final hidden states
   are cached with the labels in ``data.safetensors``.
2. **Training.** Head i, on the hidden state that predicted token t+1, learns token t+2+i by
   cross-entropy, weighted ``optim.head_decay ** i``; AdamW, linear warm-up then cosine decay. With
   ``draft_vocab: N`` the heads score only the N tokens most frequent in the training answers (their
   rows of the frozen LM head): training and drafting then cost N/V of the full head, and a label outside
   them is left out of the loss (and counted as a miss in evaluation).
3. **Evaluation.** Per-head top-1 / top-5 accuracy on held-out text: the target's answers to MT-Bench
   and HumanEval prompts, and raw Wikipedia articles never trained on. On a validation split of the
   training prompts the draft tree is chosen: the paths of head ranks that the target most often
   follows, in priority order (:mod:`specdec.drafters.medusa`).
4. **Checkpoints** are safetensors (never pickle) written to a temporary directory and renamed into
   place, then published by atomically rewriting ``checkpoints/latest``, every ``save_every`` steps and
   on Ctrl-C; the data order is a function of (seed, epoch), so a resumed run reproduces the
   uninterrupted one bit for bit. Resuming with another training configuration is refused.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import hydra
import torch
import torch.nn.functional as F
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from safetensors.torch import load_file, save_file

from specdec.config import LoggerConfig, config_dir, register_configs
from specdec.drafters.base import DecodeState, Drafter, Proposal
from specdec.drafters.medusa import MedusaHeads, save_heads
from specdec.engine import speculative_generate
from specdec.medusa_prompts import instruction_prompts, magpie_prompts

log = logging.getLogger(__name__)
IGNORE = -100


@dataclass
class MedusaDataConfig:
    mode: str = "self_distill"  # "self_distill" (the target's greedy answers to prompts) or "text" (a corpus)
    num_prompts: int = 640  # self_distill: instruction prompts answered by the target
    magpie_fraction: float = 0.0  # self_distill: share of those prompts written by the target itself (Magpie)
    max_new_tokens: int = 96  # self_distill: answer length
    batch_size: int = 64  # sequences per target forward while building the data
    text_sources: list[str] = field(default_factory=lambda: ["wikipedia", "stdlib", "shakespeare"])  # mode=text
    text_seq_len: int = 256  # mode=text: tokens per chunk
    skip_first: int = 16  # rows of each corpus never trained on (the benchmark runs' prompts)
    val_fraction: float = 0.1  # sequences held out to choose the tree and report validation accuracy


@dataclass
class MedusaEvalConfig:
    answer_sources: list[str] = field(default_factory=lambda: ["mtbench", "humaneval"])  # held-out prompts
    limit_per_source: int = 24
    max_new_tokens: int = 64
    text_sources: list[str] = field(default_factory=lambda: ["wikipedia"])  # their first data.skip_first rows
    tree_nodes: int = 32  # paths stored with the heads, best first
    max_rank: int = 10  # candidates per head considered for the tree


@dataclass
class MedusaOptimConfig:
    epochs: int = 2
    batch_size: int = 256  # positions per optimiser step (over all processes)
    lr: float = 1e-2
    weight_decay: float = 0.0
    warmup_steps: int = 20
    head_decay: float = 0.8  # loss weight of head i is head_decay ** i (Medusa-1)
    soft_labels: bool = False  # learn the target's distribution over each label, not the label alone


@dataclass
class TrainMedusaConfig:
    target: str = "smollm2-135m"  # alias, local directory or hub id
    num_heads: int = 3
    own_lm_head: bool = False  # an own (trainable) LM head per Medusa head instead of the target's, shared
    token_aware: bool = False  # heads also read the emitted token and the draft path (Hydra-style)
    draft_vocab: Optional[int] = 8192  # heads score the N most frequent answer tokens only (FR-Spec); null = all
    seed: int = 0
    threads: Optional[int] = None  # torch CPU threads; null = torch's default
    run_name: str = "smollm2-135m"
    output_dir: str = "outputs/train_medusa/${run_name}"  # checkpoints, data cache, results; reused to resume
    export: Optional[str] = None  # also write heads.safetensors + provenance.json to this directory
    export_dtype: Optional[str] = None  # weights' dtype in the exported file, e.g. float16 (half the size); null = float32
    save_every: int = 50  # optimiser steps between checkpoints
    log_every: int = 10
    stop_after_steps: Optional[int] = None  # stop (checkpointed) after this many steps of this invocation
    data: MedusaDataConfig = field(default_factory=MedusaDataConfig)
    eval: MedusaEvalConfig = field(default_factory=MedusaEvalConfig)
    optim: MedusaOptimConfig = field(default_factory=MedusaOptimConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)


register_configs()
ConfigStore.instance().store(name="train_medusa_schema", node=TrainMedusaConfig)

# --- data: the target's hidden states and the heads' labels -------------------------------------------


def _eos_ids(target) -> set[int]:
    eos = getattr(target.generation_config, "eos_token_id", None)
    return set() if eos is None else {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}


class _HiddenRecorder(Drafter):
    """A drafter that proposes nothing and records, at each step, the hidden state that predicted each
    row's newest token: plain decoding on the engine's fast path, with the hidden states for free."""

    def propose(self, state: DecodeState, k: int) -> Proposal:
        return Proposal(tokens=state.last_tokens.new_zeros(len(state.active), 0), num_proposed=[0] * len(state.active))

    def start(self, state: DecodeState) -> None:
        self.hidden = [state.last_hidden.float().cpu()]

    def observe(self, state: DecodeState) -> None:
        self.hidden.append(state.last_hidden.float().cpu())


@torch.no_grad()
def answer_sequences(target, prompts: list[list[int]], max_new_tokens: int, batch_size: int, pad_id: int,
                     ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The target's greedy answers: per prompt (hidden [n, H], tokens [n]), hidden[s] having predicted
    tokens[s] (EOS included). A Llama-family target runs through specdec's own batched decode loop (its
    plain greedy decoding, several times faster than ``generate`` here); any other causal LM through
    transformers' ``generate``, which hands out the final hidden state of every step. Either way the
    answers cost no second pass."""
    from specdec.models import supports

    device = target.device
    eos = _eos_ids(target)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
    out: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    started = time.perf_counter()
    for start in range(0, len(order), batch_size):
        chunk = order[start: start + batch_size]
        width = max(len(prompts[i]) for i in chunk)
        ids = torch.tensor([[pad_id] * (width - len(prompts[i])) + prompts[i] for i in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in chunk], device=device)
        if supports(target):
            recorder = _HiddenRecorder()
            result = speculative_generate(target, recorder, ids, k=1, max_new_tokens=max_new_tokens,
                                          attention_mask=mask, eos_token_id=sorted(eos) or None)
            hidden = torch.stack(recorder.hidden, 1)  # [B, steps, H]
            answers = result.sequences
        else:
            result = target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=pad_id, output_hidden_states=True, return_dict_in_generate=True)
            hidden = torch.stack([step[-1][:, -1] for step in result.hidden_states], 1).float().cpu()
            answers = result.sequences[:, width:].tolist()
        for row, i in enumerate(chunk):
            answer = answers[row]
            n = next((j + 1 for j, t in enumerate(answer) if t in eos), len(answer))
            out[i] = (hidden[row, :n].clone(), torch.tensor(answer[:n], dtype=torch.long))
        done = min(start + batch_size, len(order))
        tokens = sum(len(out[i][1]) for i in order[:done])
        log.info("answered %d/%d prompts (%d tokens, %.0f tokens/s)", done, len(order), tokens,
                 tokens / (time.perf_counter() - started))
    return [out[i] for i in range(len(prompts))]


@torch.no_grad()
def text_sequences(target, texts: list[list[int]], seq_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Chunks of token ids through the target: per chunk (hidden [n, H], next tokens [n])."""
    out = []
    for ids in texts:
        for start in range(0, max(len(ids) - 1, 0), seq_len):
            chunk = torch.tensor(ids[start: start + seq_len + 1], device=target.device)[None]  # [1, n+1]
            hidden = target(chunk[:, :-1], output_hidden_states=True).hidden_states[-1]  # [1, n, H] final
            out.append((hidden[0].float().cpu(), chunk[0, 1:].cpu()))
    return out


def head_labels(sequences: list[tuple[torch.Tensor, torch.Tensor]], num_heads: int,
                ) -> tuple[torch.Tensor, torch.Tensor]:  # hidden [P, H], labels [P, num_heads]
    """Head i's label at position s is tokens[s + 1 + i] (IGNORE past the end); positions where even
    head 0 has no label are dropped."""
    hidden, labels = [], []
    for h, tokens in sequences:
        n = tokens.shape[0] - 1
        if n <= 0:
            continue
        lab = torch.full((n, num_heads), IGNORE, dtype=torch.long)
        for i in range(num_heads):
            lab[: max(n - i, 0), i] = tokens[1 + i:]
        hidden.append(h[:n])
        labels.append(lab)
    return torch.cat(hidden), torch.cat(labels)


def build_data(cfg: TrainMedusaConfig, target, tokenizer, prompts_path: Path | None = None,
               ) -> dict[str, torch.Tensor]:
    """Every split as ``{split}.hidden`` [P, H] and ``{split}.labels`` [P, heads]: train, val, eval sets.
    ``prompts_path``: where to write the self-distillation prompts (JSON lines), for the record."""
    from specdec.data import encode_prompt, load_prompts

    data, heads = cfg.data, cfg.num_heads
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if data.mode == "self_distill":
        if not 0.0 <= data.magpie_fraction <= 1.0:
            raise ValueError(f"data.magpie_fraction must be in [0, 1], got {data.magpie_fraction}")
        num_magpie = round(data.num_prompts * data.magpie_fraction)
        rows = instruction_prompts(data.num_prompts - num_magpie, data.skip_first, cfg.seed)
        if num_magpie:
            rows += magpie_prompts(target, tokenizer, num_magpie, cfg.seed, data.batch_size)
            log.info("the target wrote %d prompts, e.g. %r", num_magpie, rows[-1]["text"][:200])
        if prompts_path is not None:
            tmp = prompts_path.with_name(f".{prompts_path.name}.tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
            tmp.replace(prompts_path)
        seqs = answer_sequences(target, [encode_prompt(tokenizer, r) for r in rows], data.max_new_tokens,
                                data.batch_size, pad_id)
    elif data.mode == "text":
        texts = [tokenizer(r["text"])["input_ids"] for s in data.text_sources
                 for r in list(load_prompts(s, seed=0))[data.skip_first:]]
        seqs = text_sequences(target, texts, data.text_seq_len)
    else:
        raise ValueError(f"data.mode must be 'self_distill' or 'text', got {data.mode!r}")
    order = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    num_val = max(1, int(len(seqs) * data.val_fraction))
    splits = {"train": [seqs[i] for i in order[num_val:]], "val": [seqs[i] for i in order[:num_val]]}
    for source in cfg.eval.answer_sources:
        rows = load_prompts(source, limit=cfg.eval.limit_per_source)
        splits[f"answers_{source}"] = answer_sequences(
            target, [encode_prompt(tokenizer, r) for r in rows], cfg.eval.max_new_tokens, data.batch_size, pad_id)
    for source in cfg.eval.text_sources:
        texts = [tokenizer(r["text"])["input_ids"] for r in list(load_prompts(source, seed=0))[: data.skip_first]]
        splits[f"text_{source}"] = text_sequences(target, texts, data.text_seq_len)
    tensors = {}
    for name, split in splits.items():
        tensors[f"{name}.hidden"], tensors[f"{name}.labels"] = head_labels(split, heads)
    return tensors


def _fingerprint(cfg: TrainMedusaConfig) -> str:
    """What the cached data depends on (magpie_fraction only when used: caches made before it stay valid)."""
    data = {k: v for k, v in vars(cfg.data).items() if k != "magpie_fraction" or v}
    return json.dumps({"target": cfg.target, "heads": cfg.num_heads, "seed": cfg.seed, "data": data,
                       "eval": {k: v for k, v in vars(cfg.eval).items() if k not in ("tree_nodes", "max_rank")}},
                      sort_keys=True, default=list)


def load_or_build_data(cfg: TrainMedusaConfig, target, tokenizer, path: Path) -> dict[str, torch.Tensor]:
    if path.is_file():
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            cached = (f.metadata() or {}).get("fingerprint")
        if cached == _fingerprint(cfg):
            return load_file(str(path))
        raise ValueError(f"{str(path)!r} holds data built with another configuration; use another run_name "
                         f"(or delete {str(path.parent)!r} to start over)")
    start = time.perf_counter()
    tensors = build_data(cfg, target, tokenizer, prompts_path=path.with_name("prompts.jsonl"))
    tmp = path.with_name(f".{path.name}.tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp),
              metadata={"fingerprint": _fingerprint(cfg), "build_s": f"{time.perf_counter() - start:.1f}"})
    tmp.replace(path)
    return tensors


def data_build_seconds(path: Path) -> float | None:
    """How long the cached data took to build (None: a cache written before this was recorded)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        value = (f.metadata() or {}).get("build_s")
    return None if value is None else float(value)


def with_previous_token(hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For token-aware heads: the rows whose emitted token (tokens[s], which hidden[s] predicted) is in the
    cache — every row but each answer's first — as (hidden, tokens [P', 1 + heads] = tokens[s], labels)."""
    prev = torch.full((labels.shape[0],), -1, dtype=torch.long)
    # row r-1 belongs to the same answer unless it was that answer's last row (no label for head 1 there)
    prev[1:] = torch.where(labels[:-1, 1] != IGNORE, labels[:-1, 0], -1) if labels.shape[1] > 1 else -1
    keep = prev >= 0
    return hidden[keep], torch.cat([prev[keep, None], labels[keep]], 1)


def known_embeddings(embed_weight: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:  # [P, 1+h] -> [P, h, H]
    """What token-aware head i reads besides the hidden state: embeddings of tokens[s .. s+i] (a path token
    past the answer's end is IGNORE; its head has no label there, so any embedding will do)."""
    return embed_weight[tokens[:, :-1].clamp(min=0)]


def draft_vocabulary(labels: torch.Tensor, vocab_size: int, size: int | None) -> torch.Tensor | None:
    """The ``size`` token ids most frequent among ``labels`` (ascending ids; ties to the lower id), or None
    (the full vocabulary) when ``size`` is None or covers it."""
    if size is None or size >= vocab_size:
        return None
    if size < 1:
        raise ValueError(f"draft_vocab must be null or >= 1, got {size}")
    counts = torch.bincount(labels[labels != IGNORE].flatten(), minlength=vocab_size).double()
    counts -= torch.arange(vocab_size, dtype=torch.double) / vocab_size  # stable tie-break: lower id first
    return counts.topk(size).indices.sort().values


def to_draft_labels(labels: torch.Tensor, token_ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Token-id labels -> indices into the draft vocabulary (IGNORE where a token lies outside it)."""
    if token_ids is None:
        return labels
    index = torch.full((vocab_size + 1,), IGNORE, dtype=torch.long)  # the extra slot maps IGNORE to IGNORE
    index[token_ids] = torch.arange(token_ids.numel())
    return index[torch.where(labels == IGNORE, vocab_size, labels)]


# --- loss, evaluation, tree ----------------------------------------------------------------------------


def medusa_loss(logits: torch.Tensor, labels: torch.Tensor, head_decay: float, targets: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, list[float]]:  # logits [P, h, V], labels [P, h] -> loss, per-head CE
    """Medusa-1's loss: Σ_i head_decay^i · CE_i, CE_i against head i's labels, or against ``targets`` [P, h, V]
    (distributions, see :func:`soft_targets`) where given; positions labelled IGNORE never count."""
    if targets is None:
        losses = [F.cross_entropy(logits[:, i], labels[:, i], ignore_index=IGNORE) for i in range(labels.shape[1])]
    else:
        ce = -(targets * F.log_softmax(logits.float(), -1)).sum(-1)  # [P, h]
        valid = labels != IGNORE
        losses = [ce[:, i][valid[:, i]].mean() for i in range(labels.shape[1])]
    losses = [torch.nan_to_num(x) for x in losses]  # a batch without labels for a far head contributes 0
    total = sum(head_decay ** i * x for i, x in enumerate(losses))
    return total, [float(x.detach()) for x in losses]


@torch.no_grad()
def soft_targets(hidden: torch.Tensor, idx: torch.Tensor, labels: torch.Tensor, lm_head_weight: torch.Tensor,
                 ) -> torch.Tensor:  # -> [b, h, V'] one distribution per (position, head)
    """The target's own distribution over each label (self-distillation with soft labels, as Hydra++ and
    Medusa-2 train): head i's label at row r was predicted by the hidden state at row r + 1 + i of the same
    sequence, so its distribution over the (draft) vocabulary is free. Used where that row's prediction is
    the label — every position of a greedy answer but the last few, where the row belongs to the next
    sequence; elsewhere (and for an IGNORE label) the one-hot label.

    hidden [P, H] rows in sequence order; idx [b] rows of the batch; labels [P, h] draft-vocabulary indices."""
    device = lm_head_weight.device
    lab = labels[idx].to(device)  # [b, h]
    rows = idx[:, None].cpu() + 1 + torch.arange(lab.shape[1])  # [b, h]
    logits = hidden[rows.clamp(max=hidden.shape[0] - 1)].to(lm_head_weight) @ lm_head_weight.t()  # [b, h, V']
    agree = (rows < hidden.shape[0]).to(device) & (lab != IGNORE) & (logits.argmax(-1) == lab)
    onehot = F.one_hot(lab.clamp(min=0), logits.shape[-1]).to(logits.dtype)
    return torch.where(agree[..., None], logits.float().softmax(-1), onehot)


@torch.no_grad()
def label_ranks(heads: MedusaHeads, lm_head_weight: torch.Tensor, hidden: torch.Tensor, labels: torch.Tensor,
                max_rank: int, chunk: int = 512, known: Callable[[slice], torch.Tensor] | None = None,
                ) -> torch.Tensor:  # -> [P, h]: rank of each label, -1 = beyond
    """Where each label sits among its head's top ``max_rank`` tokens (-1: further down, or no label).
    ``known``: rows -> the token-aware heads' known-token embeddings [c, h, H] (the true path)."""
    out = []
    for start in range(0, hidden.shape[0], chunk):
        rows = slice(start, start + chunk)
        logits = heads(hidden[rows], lm_head_weight, known=None if known is None else known(rows))  # [c, h, V]
        top = logits.topk(max_rank, dim=-1).indices  # [c, h, r]
        hit = top == labels[start: start + chunk, :, None]  # [c, h, r]
        out.append(torch.where(hit.any(-1), hit.float().argmax(-1), -1))
    return torch.cat(out)


def accuracies(ranks: torch.Tensor, labels: torch.Tensor) -> dict[str, list[float]]:  # [P, h] each
    valid = labels != IGNORE
    n = valid.sum(0).clamp(min=1)
    return {f"top{k}": (((ranks >= 0) & (ranks < k) & valid).sum(0) / n).tolist() for k in (1, 5)}


def tree_from_ranks(ranks: torch.Tensor, labels: torch.Tensor, num_nodes: int) -> tuple[list[list[int]], list[float]]:
    """The ``num_nodes`` paths of head ranks most often followed, best first, and the expected τ of the
    tree made of the first n paths (n = 1..num_nodes) under greedy verification: 1 + Σ P(path accepted).

    At position s the accepted path is the prefix of (rank of head 0's label, rank of head 1's, ...) up to
    the first head whose label is not among its candidates. A path is accepted no more often than its
    parent, so taking paths by frequency always takes parents first and gives the best tree of each size."""
    counts: Counter[tuple[int, ...]] = Counter()
    for row in torch.where(labels == IGNORE, -1, ranks).tolist():
        for depth in range(len(row)):
            if row[depth] < 0:
                break
            counts[tuple(row[: depth + 1])] += 1
    best = [list(p) for p, _ in sorted(counts.items(), key=lambda kv: (-kv[1], len(kv[0]), kv[0]))[:num_nodes]]
    return best, tree_tau(ranks, labels, best)


def tree_tau(ranks: torch.Tensor, labels: torch.Tensor, paths: list[list[int]]) -> list[float]:
    """The expected τ under greedy verification of the tree made of the first n ``paths`` (n = 1..len),
    at held-out positions: 1 + the mean number of tree nodes on the accepted path."""
    index = {tuple(p): n for n, p in enumerate(paths)}
    accepted = [0] * len(paths)  # positions whose accepted path reaches path n
    for row in torch.where(labels == IGNORE, -1, ranks).tolist():
        for depth in range(len(row)):
            n = index.get(tuple(row[: depth + 1])) if row[depth] >= 0 else None
            if n is None:
                break
            accepted[n] += 1
    total, tau = max(len(labels), 1), []
    for count in accepted:
        tau.append((tau[-1] if tau else 1.0) + count / total)
    return tau


# --- checkpoints ---------------------------------------------------------------------------------------


def save_checkpoint(directory: Path, step: int, heads: MedusaHeads, optimizer: torch.optim.Optimizer,
                    meta: dict[str, Any]) -> None:
    """Write checkpoints/step-N (tmp dir + rename), then point checkpoints/latest at it (tmp file + replace)."""
    root = directory / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final, tmp = root / f"step-{step}", root / f".step-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({k: v.detach().cpu().contiguous() for k, v in heads.state_dict().items()}, str(tmp / "heads.safetensors"))
    state = optimizer.state_dict()
    tensors = {f"{pid}.{key}": v.detach().cpu().contiguous() for pid, st in state["state"].items()
               for key, v in st.items() if torch.is_tensor(v)}
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    (tmp / "state.json").write_text(json.dumps({"step": step, "param_groups": state["param_groups"], **meta}, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    latest_tmp = root / ".latest.tmp"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, root / "latest")
    for old in root.glob("step-*"):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(directory: Path, heads: MedusaHeads, optimizer: torch.optim.Optimizer,
                    expect: dict[str, Any] | None = None) -> int:
    """Restore the latest checkpoint into ``heads`` and ``optimizer``; return its step (0 if none).
    ``expect``: the training configuration the checkpoint must have been written with."""
    latest = directory / "checkpoints" / "latest"
    if not latest.is_file():
        return 0
    ckpt = directory / "checkpoints" / latest.read_text().strip()
    heads.load_state_dict(load_file(str(ckpt / "heads.safetensors")))
    meta = json.loads((ckpt / "state.json").read_text())
    if expect is not None and meta.get("run") != expect:
        raise ValueError(f"the checkpoint in {str(ckpt)!r} was written with another training configuration "
                         f"({meta.get('run')} vs {expect}); use another run_name, or delete the directory to start over")
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in load_file(str(ckpt / "optimizer.safetensors")).items():
        pid, key = name.split(".", 1)
        state.setdefault(int(pid), {})[key] = tensor
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    return int(meta["step"])


def checkpoint_train_seconds(directory: Path) -> float | None:
    """Training time recorded in the latest checkpoint: 0 without one, None if it predates the record."""
    latest = directory / "checkpoints" / "latest"
    if not latest.is_file():
        return 0.0
    meta = json.loads((directory / "checkpoints" / latest.read_text().strip() / "state.json").read_text())
    return meta.get("train_s")


# --- training ------------------------------------------------------------------------------------------


def lr_at(step: int, total: int, cfg: MedusaOptimConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(total - cfg.warmup_steps, 1)
    return cfg.lr * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def train(cfg: TrainMedusaConfig, target=None, tokenizer=None) -> dict[str, Any]:
    """Build (or load) the data, train (or resume), evaluate, export. Returns the metrics.

    ``target``/``tokenizer``: an already loaded model (tests); default: ``load_target(cfg.target)``."""
    from accelerate import Accelerator

    from specdec.loading import load_target

    export_dtype(cfg)  # a bad value fails now, not after training
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    accelerator = Accelerator(log_with="wandb" if cfg.logger.name == "wandb" else None)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    start = time.perf_counter()
    if target is None:
        target, tokenizer = load_target(cfg.target, device=accelerator.device)
    target.requires_grad_(False)
    with accelerator.main_process_first():  # the main process builds the data; the others read its cache
        data = load_or_build_data(cfg, target, tokenizer, out_dir / "data.safetensors")
    times["data_s"] = time.perf_counter() - start
    times["data_build_s"] = data_build_seconds(out_dir / "data.safetensors")  # when it was built (None: unrecorded)

    full_lm_head = target.get_output_embeddings().weight.detach().to(accelerator.device)  # [V, H], frozen
    vocab_size = full_lm_head.shape[0]
    token_ids = draft_vocabulary(data["train.labels"], vocab_size, cfg.draft_vocab)
    if cfg.token_aware and cfg.num_heads < 2:
        raise ValueError("token_aware needs num_heads >= 2 (the cache marks where answers end by head 2's labels)")
    heads = MedusaHeads(full_lm_head.shape[1], vocab_size, cfg.num_heads, cfg.own_lm_head, token_ids=token_ids,
                        token_aware=cfg.token_aware)
    heads.init_lm_heads(full_lm_head)
    heads.to(accelerator.device)
    lm_head_weight = heads.draft_lm_head(full_lm_head)  # [V', H]: sliced once
    optimizer = torch.optim.AdamW(heads.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    run_config = {"num_heads": cfg.num_heads, "own_lm_head": cfg.own_lm_head, "draft_vocab": cfg.draft_vocab,
                  "seed": cfg.seed,  # soft_labels, token_aware only when on: older checkpoints still resume
                  "optim": {k: v for k, v in vars(cfg.optim).items() if k != "soft_labels" or v},
                  **({"token_aware": True} if cfg.token_aware else {})}
    first_step = load_checkpoint(out_dir, heads, optimizer, expect=run_config)
    trained_before = checkpoint_train_seconds(out_dir)  # by earlier invocations of this run
    model, optimizer = accelerator.prepare(heads, optimizer)
    if cfg.logger.name == "wandb":
        accelerator.init_trackers(cfg.logger.project, config=_plain(cfg),
                                  init_kwargs={"wandb": {"mode": cfg.logger.mode, "name": cfg.run_name}})

    embed_weight = target.get_input_embeddings().weight.detach().to(accelerator.device)  # token-aware heads

    def split(name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # hidden, labels, tokens
        hidden, labels = data[f"{name}.hidden"], data[f"{name}.labels"]
        if not cfg.token_aware:
            return hidden, labels, None
        hidden, tokens = with_previous_token(hidden, labels)
        return hidden, tokens[:, 1:], tokens

    hidden, labels, known_tokens = split("train")
    labels = to_draft_labels(labels, token_ids, vocab_size)
    steps_per_epoch = math.ceil(hidden.shape[0] / cfg.optim.batch_size)
    total = cfg.optim.epochs * steps_per_epoch
    saved = step = first_step

    def checkpoint() -> None:
        nonlocal saved
        accelerator.wait_for_everyone()
        if accelerator.is_main_process and step > saved:
            elapsed = None if trained_before is None else trained_before + time.perf_counter() - start
            save_checkpoint(out_dir, step, accelerator.unwrap_model(model), optimizer,
                            {"total_steps": total, "run": run_config, "train_s": elapsed})
        saved = step

    start = time.perf_counter()
    model.train()
    try:
        while step < total and (cfg.stop_after_steps is None or step - first_step < cfg.stop_after_steps):
            epoch, i = divmod(step, steps_per_epoch)
            order = torch.randperm(hidden.shape[0], generator=torch.Generator().manual_seed(cfg.seed * 1000 + epoch))
            idx = order[i * cfg.optim.batch_size: (i + 1) * cfg.optim.batch_size]
            idx = idx[accelerator.process_index:: accelerator.num_processes]  # this process's share of the batch
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, total, cfg.optim)
            known = None if known_tokens is None else known_embeddings(embed_weight, known_tokens[idx].to(embed_weight.device))
            logits = model(hidden[idx].to(accelerator.device), lm_head_weight, known=known)  # [b, h, V]
            targets = soft_targets(hidden, idx, labels, lm_head_weight) if cfg.optim.soft_labels else None
            loss, per_head = medusa_loss(logits, labels[idx].to(accelerator.device), cfg.optim.head_decay, targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % cfg.log_every == 0 or step == total:
                log.info("step %d/%d loss %.4f per head %s", step, total, float(loss.detach()), [round(x, 3) for x in per_head])
                accelerator.log({"loss": float(loss.detach()), **{f"loss_head{j}": x for j, x in enumerate(per_head)},
                                 "lr": optimizer.param_groups[0]["lr"]}, step=step)
            if step % cfg.save_every == 0 or step == total:
                checkpoint()
    except KeyboardInterrupt:
        checkpoint()  # nothing trained so far is lost; rerun the same command to resume
        raise
    checkpoint()
    # training time over every invocation of this run (None: resumed from a checkpoint that predates the record)
    times["train_s"] = None if trained_before is None else trained_before + time.perf_counter() - start
    if first_step:
        times["resumed_at_step"] = first_step
    metrics: dict[str, Any] = {"step": step, "total_steps": total, "finished": step >= total,
                               "train_positions": int(hidden.shape[0]), "draft_vocab_size": heads.draft_vocab_size,
                               "times_s": times}
    if step < total or not accelerator.is_main_process:
        accelerator.end_training()
        return metrics

    start = time.perf_counter()
    heads = accelerator.unwrap_model(model).eval()
    evals, split_ranks = {}, {}
    for name in sorted({key.split(".")[0] for key in data} - {"train"}):
        h, lab, tokens = split(name)
        h, lab = h.to(accelerator.device), lab.to(accelerator.device)
        draft_lab = to_draft_labels(lab.cpu(), token_ids, vocab_size).to(accelerator.device)
        known = None if tokens is None else (lambda rows, t=tokens: known_embeddings(embed_weight, t[rows].to(embed_weight.device)))
        ranks = label_ranks(heads, lm_head_weight, h, draft_lab, cfg.eval.max_rank, known=known)  # outside: a miss
        valid = lab != IGNORE
        evals[name] = {"positions": int(h.shape[0]), **accuracies(ranks, lab),
                       "in_draft_vocab": float(((draft_lab != IGNORE) & valid).sum() / valid.sum().clamp(min=1))}
        if name == "val":
            tree, tau = tree_from_ranks(ranks.cpu(), lab.cpu(), cfg.eval.tree_nodes)
        split_ranks[name] = ranks.cpu(), lab.cpu()
    for name, (ranks, lab) in split_ranks.items():  # what the tree chosen on val promises elsewhere
        evals[name]["expected_tau_greedy"] = [round(t, 4) for t in tree_tau(ranks, lab, tree)]
    times["eval_s"] = time.perf_counter() - start
    metrics.update(eval=evals, tree=tree, expected_tau_greedy=[round(t, 4) for t in tau], times_s=times)
    accelerator.log({f"{n}/{k}_head{j}": v for n, e in evals.items() for k in ("top1", "top5")
                     for j, v in enumerate(e[k])}, step=total)
    save_heads(out_dir / "heads.safetensors", heads, target=cfg.target, tree=tree)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=1))
    if cfg.export:
        export(Path(cfg.export), heads, cfg, metrics, num_sequences={k: int(v.shape[0]) for k, v in data.items()
                                                                    if k.endswith(".labels")})
    accelerator.end_training()
    return metrics


def _plain(cfg: Any) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


def _git_commit() -> str:
    try:
        root = Path(__file__).resolve().parent.parent
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True)
        return commit.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def export_dtype(cfg: TrainMedusaConfig) -> torch.dtype | None:
    if not cfg.export_dtype:
        return None
    dtype = getattr(torch, cfg.export_dtype, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"export_dtype={cfg.export_dtype!r} is not a torch floating dtype; use float16, bfloat16, "
                         f"float32 or null")
    return dtype


def export(directory: Path, heads: MedusaHeads, cfg: TrainMedusaConfig, metrics: dict[str, Any],
           num_sequences: dict[str, int]) -> None:
    """heads.safetensors (with the tree) + provenance.json: command, data, commit, metrics, date."""
    save_heads(directory / "heads.safetensors", heads, target=cfg.target, tree=metrics["tree"],
               dtype=export_dtype(cfg))
    provenance = {
        "command": " ".join(["python -m specdec.train_medusa", *sys.argv[1:]]),
        "config": _plain(cfg),
        "data": {"mode": cfg.data.mode, "positions": num_sequences,
                 "description": "the target's greedy answers (self-distillation) to generated instruction prompts in "
                                "MT-Bench's eight categories (specdec/medusa_prompts.py: templates filled from Wikipedia "
                                "titles and sentences, stdlib signatures and docstrings, the Lee news corpus, Shakespeare "
                                f"and word lists, each corpus minus its first {cfg.data.skip_first} rows), plus passages "
                                "and code to continue; MT-Bench and HumanEval held out"
                                + (f"; {cfg.data.magpie_fraction:.0%} of the prompts written by the target itself "
                                   "(Magpie)" if cfg.data.magpie_fraction else "")
                                if cfg.data.mode == "self_distill" else
                                f"chunks of {cfg.data.text_sources} (first {cfg.data.skip_first} rows excluded)"},
        "git_commit": _git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} CPU, {torch.get_num_threads()} threads" if not torch.cuda.is_available()
        else torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "metrics": metrics,
        "reference": "Medusa-1 on Vicuna-7B, head top-1 accuracy: 0.56 / 0.32 / 0.20 (heads 1..3)",
    }
    tmp = directory / ".provenance.json.tmp"
    tmp.write_text(json.dumps(provenance, indent=1))
    os.replace(tmp, directory / "provenance.json")


@hydra.main(config_path=config_dir(), config_name="train_medusa", version_base="1.3")
def main(dict_cfg: DictConfig) -> float:
    cfg: TrainMedusaConfig = OmegaConf.to_object(dict_cfg)
    metrics = train(cfg)
    print(json.dumps(metrics, indent=1))
    return metrics.get("eval", {}).get("val", {}).get("top1", [math.nan])[0]  # what a sweep maximises


if __name__ == "__main__":
    main()
