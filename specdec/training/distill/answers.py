"""The target's own answers and the hidden states behind them: what every learned drafter learns from.

A :class:`Sequence` is one answer (or one chunk of a corpus) with, at each position s, the target's final
hidden state that predicted ``tokens[s]``, and optionally the hidden states of other layers. The target
runs once, without gradients: a Llama-family target through specdec's own batched decode loop (its plain
greedy decoding, several times faster than ``generate`` here), any other causal LM through transformers'
``generate``. The final hidden state comes free with the answer; other layers cost one teacher-forced
forward of prompt + answer.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from specdec.drafters.base import DecodeState, NoDrafter
from specdec.jobs.data import left_pad
from specdec.models.loading import stop_token_ids

log = logging.getLogger(__name__)


@dataclass
class Sequence:
    context: torch.Tensor  # [c] long: the tokens before the first position (the prompt, or a chunk's first token)
    tokens: torch.Tensor  # [n] long: tokens[s] is what the target emitted (or the corpus holds) at position s
    hidden: torch.Tensor  # [n, H] float32: the target's final hidden state that predicted tokens[s]
    features: torch.Tensor | None = None  # [n, L, H] float32: the hidden states of the asked-for layers there
    context_hidden: torch.Tensor | None = None  # [c - 1, H]: the final hidden state at the context's positions
    context_features: torch.Tensor | None = None  # [c - 1, L, H]: the layers' there (before the one predicting tokens[0])


class HiddenRecorder(NoDrafter):
    """A drafter that proposes nothing and records, at each step, the hidden state that predicted each
    row's newest token: plain decoding on the engine's fast path, with the hidden states for free."""

    def start(self, state: DecodeState) -> None:
        self.hidden = [state.last_hidden.float().cpu()]

    def observe(self, state: DecodeState) -> None:
        self.hidden.append(state.last_hidden.float().cpu())


@torch.no_grad()
def _answer_batch(target, ids: torch.Tensor, mask: torch.Tensor, max_new_tokens: int, pad_id: int, eos: set[int],
                  decoder=None) -> tuple[torch.Tensor, list[list[int]]]:
    """ids, mask [B, T] -> the recorded hidden states [B, steps, H] and the answers. ``decoder``: the target's
    compact decoder to run (a :class:`~specdec.models.GraphedDecoder` on a GPU), None where it has none
    (transformers' ``generate`` then)."""
    from specdec import speculative_generate

    if decoder is not None:
        recorder = HiddenRecorder()
        result = speculative_generate(decoder, recorder, ids, k=1, max_new_tokens=max_new_tokens,
                                      attention_mask=mask, eos_token_id=sorted(eos) or None)
        return torch.stack(recorder.hidden, 1), result.sequences
    result = target.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=pad_id, output_hidden_states=True, return_dict_in_generate=True)
    hidden = torch.stack([step[-1][:, -1] for step in result.hidden_states], 1).float().cpu()
    return hidden, result.sequences[:, ids.shape[1]:].tolist()


def answer_sequences(target, prompts: list[list[int]], max_new_tokens: int, batch_size: int, pad_id: int,
                     layers: tuple[int, ...] = (), context: bool = False) -> list[Sequence]:
    """The target's greedy answers to ``prompts``, one :class:`Sequence` per prompt (EOS included), in the
    prompts' order; ``layers``: hidden-state indices (0 = embeddings, as transformers counts) to record too;
    ``context``: record them (and the final hidden state) at the prompt's positions as well."""
    out = answer_shard(target, prompts, max_new_tokens, batch_size, pad_id, layers, context)
    return [out[i] for i in range(len(prompts))]


@torch.no_grad()
def answer_shard(target, prompts: list[list[int]], max_new_tokens: int, batch_size: int, pad_id: int,
                 layers: tuple[int, ...] = (), context: bool = False,
                 shard: tuple[int, int] = (0, 1), feature_batch: int = 1) -> dict[int, Sequence]:
    """:func:`answer_sequences`' share of a process: ``shard`` = (index, count) answers the batches b with
    b % count == index, batched as one process batches them all (prompts sorted by length, ``batch_size`` each),
    so every answer and hidden state is the one a single process computes. ``feature_batch``: answers per
    teacher-forced forward that reads the ``layers`` (:func:`batch_features`). Returns {prompt index: Sequence}."""
    from specdec.models import supports, target_decoder

    index, count = shard
    device = target.device
    eos = set(stop_token_ids(target))  # the model's own stop tokens (not the tokenizer's <|endoftext|>)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
    batches = [order[start: start + batch_size] for start in range(0, len(order), batch_size)][index::count]
    out: dict[int, Sequence] = {}
    # the compact decoder, on a GPU replaying CUDA graphs (one wrapper: its cache and graphs serve every batch)
    decoder = target_decoder(target) if supports(target) else None
    started = time.perf_counter()
    for done, chunk in enumerate(batches, start=1):
        ids, mask = left_pad([prompts[i] for i in chunk], pad_id, device)
        hidden, answers = _answer_batch(target, ids, mask, max_new_tokens, pad_id, eos, decoder)
        for row, i in enumerate(chunk):
            answer = answers[row]
            n = next((j + 1 for j, t in enumerate(answer) if t in eos), len(answer))
            out[i] = Sequence(torch.tensor(prompts[i], dtype=torch.long), torch.tensor(answer[:n], dtype=torch.long),
                              hidden[row, :n].clone())
        tokens = sum(len(seq.tokens) for seq in out.values())
        log.info("answered %d/%d prompts%s (%d tokens, %.0f tokens/s)", len(out),
                 sum(map(len, batches)), f" (process {index} of {count})" if count > 1 else "", tokens,
                 tokens / (time.perf_counter() - started))
    if layers or context:
        started = time.perf_counter()
        seqs = list(out.values())
        by_length = sorted(seqs, key=lambda seq: seq.context.numel() + seq.tokens.numel())  # little padding
        groups = [[seq] for seq in seqs] if feature_batch == 1 else \
            [by_length[i: i + feature_batch] for i in range(0, len(seqs), feature_batch)]
        done = 0
        for group in groups:
            batch_features(target, group, layers, context)
            done += len(group)
            if done % 64 < len(group) or done == len(out):
                log.info("stored the feature layers of %d/%d answers (%.1f s)", done, len(out),
                         time.perf_counter() - started)
    return out


def hidden_states(target, ids: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Every layer's hidden states of ``ids`` [B, T] (embeddings first, the final norm's output last), from the
    transformer body alone: the LM head's logits, most of a forward's cost for a large vocabulary (Gemma's 262k
    rows), are not needed. ``mask`` [B, T]: 1 where a row's token is (None: every position)."""
    body = getattr(target, "base_model", target)
    options = {} if mask is None else {"attention_mask": mask}
    return body(ids, output_hidden_states=True, **options).hidden_states


@torch.no_grad()
def layer_features(target, seq: Sequence, layers: tuple[int, ...], context: bool = False) -> torch.Tensor | None:
    """The hidden states of ``layers`` at every position of ``seq`` ([n, L, H]; None without layers): one
    teacher-forced forward of context + tokens (the last token predicts nothing, so it is not fed).
    ``context``: also fill the sequence's ``context_hidden`` (and ``context_features`` with layers) at the
    positions before."""
    ids = torch.cat([seq.context, seq.tokens[:-1]])[None].to(target.device)  # [1, c + n - 1]
    states = hidden_states(target, ids)  # (layers + 1) x [1, c + n - 1, H]
    return _read_row(seq, states, 0, ids.shape[1], layers, context)


def _read_row(seq: Sequence, states: tuple[torch.Tensor, ...], row: int, end: int, layers: tuple[int, ...],
              context: bool) -> torch.Tensor | None:
    """Row ``row`` of a teacher-forced forward's ``states`` (its positions before ``end`` are ``seq``'s): the
    ``layers`` along ``seq``'s tokens ([n, L, H]; None without layers), and with ``context`` its ``context_hidden``
    (and ``context_features``) at the positions before."""
    first = seq.context.numel() - 1  # the position that predicted tokens[0]
    if context:
        seq.context_hidden = states[-1][row, :first].float().cpu()
        if layers:
            seq.context_features = torch.stack([states[layer][row, :first] for layer in layers], 1).float().cpu()
    return torch.stack([states[layer][row, first:end] for layer in layers], 1).float().cpu() if layers else None


@torch.no_grad()
def batch_features(target, seqs: list[Sequence], layers: tuple[int, ...], context: bool = False) -> None:
    """:func:`layer_features` of several sequences from one forward: their ids padded on the right (a causal
    model's positions before the padding never see it), each sequence's ``features`` (and ``context_*``) filled in.
    A single sequence takes :func:`layer_features` itself (no padding, no mask): the data as it was built before
    batching. Batched rows agree with it to rounding, not bit for bit (other shapes, other kernels)."""
    if len(seqs) == 1:
        seqs[0].features = layer_features(target, seqs[0], layers, context)
        return
    rows = [torch.cat([seq.context, seq.tokens[:-1]]) for seq in seqs]  # [c + n - 1] each
    width = max(row.numel() for row in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)  # [B, W]
    mask = torch.zeros(len(rows), width, dtype=torch.long)  # [B, W]: 1 where a sequence's token is
    for i, row in enumerate(rows):
        ids[i, : row.numel()], mask[i, : row.numel()] = row, 1
    states = hidden_states(target, ids.to(target.device), mask.to(target.device))  # (layers + 1) x [B, W, H]
    for i, (seq, row) in enumerate(zip(seqs, rows)):
        seq.features = _read_row(seq, states, i, row.numel(), layers, context)


def text_sequences(target, texts: list[list[int]], seq_len: int, layers: tuple[int, ...] = (),
                   context: bool = False) -> list[Sequence]:
    """Chunks of ``seq_len`` + 1 token ids through the target: position s of a chunk is its token s + 1,
    predicted from the ones before (the chunk's first token is the context)."""
    out = text_shard(target, texts, seq_len, layers, context)
    return [out[i] for i in range(len(out))]


@torch.no_grad()
def text_shard(target, texts: list[list[int]], seq_len: int, layers: tuple[int, ...] = (), context: bool = False,
               shard: tuple[int, int] = (0, 1)) -> dict[int, Sequence]:
    """:func:`text_sequences`' share of a process: ``shard`` = (index, count) runs the chunks c (counted over
    every text) with c % count == index. Returns {chunk index: Sequence}."""
    index, count = shard
    out, number = {}, 0
    for ids in texts:
        for start in range(0, max(len(ids) - 1, 0), seq_len):
            number += 1
            if (number - 1) % count != index:
                continue
            chunk = torch.tensor(ids[start: start + seq_len + 1], device=target.device)[None]  # [1, n+1]
            states = hidden_states(target, chunk[:, :-1])  # [1, n, H] each
            features = torch.stack([states[layer][0] for layer in layers], 1).float().cpu() if layers else None
            seq = Sequence(chunk[0, :1].cpu(), chunk[0, 1:].cpu(), states[-1][0].float().cpu(), features)
            if context:  # a one-token context has no position before the first prediction
                seq.context_hidden = seq.hidden[:0]
                seq.context_features = None if features is None else features[:0]
            out[number - 1] = seq
    return out
