"""An independent draft model sharing the target's vocabulary, on its own static cache.

The draft cache holds every committed token but the last two. Each proposal first feeds those two (one
forward of 2 tokens), then one token per further draft. After verification the draft cache is rolled
back to ``seq_lens - 2`` — a pointer move — which is correct whether the verifier kept 0 or all K drafts:
every slot below that bound holds a committed token (the drafts it kept were the ones fed).

Where its forwards replay graphs (a GPU) and a step's draft length is fixed (no confidence floor), the step's whole
chain (the rollback, the K forwards and the K draws, over uniforms drawn before it) replays as one graph; a
confidence floor reads each draft back, so there each forward replays its own.

A distilled student (``python -m specdec.train method=draft_model``) is a lean directory holding its own
layers only; ``path=<that directory>`` loads it with the target's embeddings and LM head stitched in
(:mod:`specdec.drafters.draft_model.student`).

**Draft length.** ``k`` drafts per step, or fewer: with ``confidence`` > 0 a step stops drafting once the
draft's probability of its own last draft falls below it in every row (transformers'
``assistant_confidence_threshold``, fixed here); with ``schedule: heuristic`` the step's length moves with
acceptance (transformers' heuristic: +2 after a step that kept every draft, else -1; between 1 and ``k``,
starting at ``k`` each generation). Both change only how many drafts are verified, never how: exactness holds.

**Draft vocabulary.** With ``draft_vocab`` = N > 0 the draft's LM head scores only the N tokens most frequent
in its training data (a student's ``token_counts.safetensors``; FR-Spec, Zhao et al. 2025): for a small target
the LM head is a large part of a draft step (SmolLM2-135M: 28M of a 4-layer student's 42M weights). q is
zero outside those N tokens, which exact verification allows: such tokens are never drafted, only emitted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable, Optional

import torch

from specdec.config import DrafterConfig
from specdec.drafters.base import DecodeState, Proposal, Traits, register, round_weights
from specdec.drafters.draft_model.core import ModelDrafter
from specdec.drafters.draft_model.cross_vocab import RULES, CrossVocabDrafter
from specdec.drafters.draft_model.student import DEFAULT_DRAFT
from specdec.drafters.loading import PATH_ALIAS, weights_path
from specdec.errors import VocabMismatchError
from specdec.models.backend import Backend
from specdec.models.graphs import replays_graphs
from specdec.models.loading import same_model
from specdec.verify.sampling import SamplingParams, logits_to_probs, sample, uniforms

CROSS_VOCAB_RULES = (*RULES, "off")  # drafter.cross_vocab: off refuses a draft with another tokenizer
EARLY_EXIT_LAYERS = 8  # drafter.path=target: the target's first 8 layers draft (all, for a smaller target)


@register("draft_model")
class DraftModelDrafter(ModelDrafter):
    """``model``: any transformers causal LM (or decoder) with the target's vocabulary.

    ``num_layers`` keeps its first N layers only (Llama family): with the target itself as ``model``
    this is a self-speculative early-exit drafter that needs no extra weights. A distilled student (a
    directory :func:`~specdec.drafters.draft_model.student.save_student` wrote) runs all its layers. ``backend``:
    how the draft's CPU forwards run (a decoder given as ``model`` keeps the one it was built on, which must be it).
    """

    @dataclass
    class Config(DrafterConfig):
        name: str = "draft_model"
        # Where the draft model is: "default", the student distilled for the default target and shipped in the
        # package; "target", the target itself (early exit, untrained); a distilled student's directory (what
        # `python -m specdec.train method=draft_model` wrote); an alias, a local path or a hub id of a model with
        # the target's vocabulary.
        path: str = DEFAULT_DRAFT
        model: Optional[str] = PATH_ALIAS  # the old name of path: still works, with a note to use path
        # Keep only the first N decoder layers (early exit). null: 8 of the target's (path=target), all of
        # another model's. A distilled student always runs all its layers.
        num_layers: Optional[int] = None
        # Stop a step's drafting once the draft's probability of its last draft is below this in every row
        # (0 = always draft k), as transformers' assistant_confidence_threshold
        confidence: float = 0.0
        schedule: str = "constant"  # constant | heuristic (+2 drafts after a step that kept all, else -1; <= k)
        # Score only the N most frequent tokens of a distilled student's training data (0 = the whole vocabulary)
        draft_vocab: int = 0
        # Round the draft's own decoder layers' weights (not the target's, shared) to 8- or 4-bit codes per block
        # of 32, which the CPU kernels stream as codes (lossy for the drafts only; verification stays exact);
        # null = as is
        weight_bits: Optional[int] = None
        # A draft model whose tokenizer differs from the target's (cross_vocab.py): auto = string-level matching
        # under greedy decoding, the token-level intersection when sampling; intersection | string force one
        # (string: greedy only); off = refuse another tokenizer. A same-tokenizer draft ignores it.
        cross_vocab: str = "auto"
        # A draft with another tokenizer reads each prompt from its last N tokens of its own on (0 = all of it): its
        # first forward, the prompt's prefill, costs as much as the target's own for a draft half the target's size
        window: int = 0

        def check(self, job) -> None:
            """Refused before any model loads: a rule or schedule that does not exist, the string rule when
            sampling, and the target itself as the draft (every draft accepted at a whole target forward each)."""
            super().check(job)
            if self.cross_vocab not in CROSS_VOCAB_RULES:
                raise ValueError(f"drafter.cross_vocab must be one of {list(CROSS_VOCAB_RULES)}, got "
                                 f"{self.cross_vocab!r}")
            if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
                raise ValueError(f"drafter.window must be an integer >= 0 (the prompt's last tokens a draft with another "
                                 f"tokenizer reads; 0 = all), got {self.window!r}")
            if self.schedule not in DraftModelDrafter.SCHEDULES:
                raise ValueError(f"drafter.schedule must be one of {list(DraftModelDrafter.SCHEDULES)}, got "
                                 f"{self.schedule!r}")
            if self.cross_vocab == "string" and job.sampling.temperature != 0:
                raise ValueError(f"drafter.cross_vocab=string is exact under greedy decoding only (a re-tokenised "
                                 f"draft has no q to verify with), and sampling.temperature="
                                 f"{job.sampling.temperature}; use drafter.cross_vocab=intersection or auto when "
                                 f"sampling")
            path = weights_path(self, "model", DEFAULT_DRAFT)
            if path not in (DEFAULT_DRAFT, "target", "", None) and same_model(path, job.target.name):
                raise ValueError(f"drafter.path={path!r} is the target itself ({job.target.name!r}): it would accept "
                                 f"every draft at the cost of a whole target forward each, never faster than plain "
                                 f"decoding; drafter=cross_vocab drafts for a target with another tokenizer "
                                 f"(target=gemma3), drafter.path=default drafts with the shipped student, "
                                 f"drafter.path=target with the target's first layers")

    @classmethod
    def from_config(cls, cfg, target=None, tokenizer=None, backend=Backend()) -> "DraftModelDrafter":
        from specdec.drafters.draft_model.student import default_student_path, is_student_dir, load_student
        from specdec.models.loading import check_same_vocab, load_target, looks_like_path

        path = weights_path(cfg, "model", DEFAULT_DRAFT)
        early_exit = path in (None, "", "target")
        student = path == DEFAULT_DRAFT or (not early_exit and is_student_dir(path))
        if student and cfg.num_layers is not None:
            raise ValueError(f"drafter.num_layers={cfg.num_layers} does not apply to a distilled student "
                             f"({path!r}: all its layers run); leave drafter.num_layers null")
        if path == DEFAULT_DRAFT:
            path = default_student_path()
            if not is_student_dir(path):
                raise FileNotFoundError(f"drafter.path={DEFAULT_DRAFT}: the shipped distilled draft model is missing "
                                        f"from {str(path)!r} (a broken install?); reinstall specdec, or train one with "
                                        f"`python -m specdec.train method=draft_model` and point drafter.path at it")
        if student:
            cls._no_window(cfg, path)
            drafter = cls(load_student(path, target), **cls._options(cfg, path), backend=backend)
            return drafter.rounded(cfg.weight_bits, target)
        if not early_exit and looks_like_path(path) and not Path(path).expanduser().is_dir():
            raise FileNotFoundError(
                f"drafter.path={path!r}: no such directory ({str(Path(path).expanduser().absolute())!r}); "
                f"pass a student written by `python -m specdec.train method=draft_model`, a model directory written "
                f"by save_pretrained, a hub id, {DEFAULT_DRAFT!r} (the shipped student) or 'target' (early exit)")
        if cfg.draft_vocab:
            raise ValueError(f"drafter.draft_vocab={cfg.draft_vocab} needs a distilled student's token counts; "
                             f"drafter.path={path!r} has none: set drafter.draft_vocab=0")
        num_layers = cfg.num_layers
        if early_exit and cfg.weight_bits is not None:
            raise ValueError(f"drafter.weight_bits={cfg.weight_bits} rounds the draft's own weights; with "
                             f"drafter.path={path!r} they are the target's: leave drafter.weight_bits null")
        if early_exit:
            model, draft_tokenizer = target, tokenizer
            if num_layers is None:
                num_layers = min(EARLY_EXIT_LAYERS, target.config.num_hidden_layers)
        else:
            model, draft_tokenizer = load_target(path, dtype=target.dtype, device=target.device)
        if tokenizer is not None and draft_tokenizer is not None and draft_tokenizer is not tokenizer:
            try:
                check_same_vocab(tokenizer, draft_tokenizer)
            except VocabMismatchError as mismatch:
                return cls._cross_vocab(cfg, path, model, draft_tokenizer, tokenizer, mismatch, backend)
        cls._no_window(cfg, path)
        drafter = cls(model, num_layers=num_layers, confidence=cfg.confidence, schedule=cfg.schedule, backend=backend)
        return drafter.rounded(cfg.weight_bits, target)

    @staticmethod
    def _no_window(cfg, path) -> None:
        """A same-tokenizer draft reads the target's own tokens, all of them: drafter.window is refused."""
        if cfg.window:
            raise ValueError(f"drafter.window={cfg.window} applies to a draft with another tokenizer than the target's; "
                             f"drafter.path={path!r} shares the target's: leave drafter.window at 0")

    @classmethod
    def _cross_vocab(cls, cfg, path, model, draft_tokenizer, tokenizer, mismatch: VocabMismatchError,
                     backend: Backend) -> "DraftModelDrafter":
        """The drafter for a draft model with another tokenizer (cross_vocab.py), or the refusal cfg asks for (a rule
        that does not exist is refused by the drafter's constructor, naming the rules)."""
        names = (f"the draft's {getattr(draft_tokenizer, 'name_or_path', '?')!r} ({len(draft_tokenizer)} tokens), "
                 f"the target's {getattr(tokenizer, 'name_or_path', '?')!r} ({len(tokenizer)} tokens)")
        if cfg.cross_vocab == "off":
            raise VocabMismatchError(f"drafter.path={path!r} has another tokenizer than the target ({names}) and "
                                     f"drafter.cross_vocab=off refuses that; set drafter.cross_vocab=auto to draft "
                                     f"across vocabularies (exact), or use a draft with the target's tokenizer") \
                from mismatch
        if cfg.confidence or cfg.num_layers is not None or cfg.weight_bits is not None:
            raise ValueError(f"drafter.confidence, num_layers and weight_bits apply to a same-tokenizer draft; "
                             f"drafter.path={path!r} drafts across vocabularies ({names}): leave them at 0 / null")
        # a model of its own: its weights stream as their codes where they are codes, whatever target.coded_weights
        # chose for the target's (the same products, so the same drafts; over float32 values a draft step costs about
        # half a float32 Gemma-3-270M step, over SmolLM2's codes a fifth)
        return CrossVocabDrafter(model, draft_tokenizer, tokenizer, rule=cfg.cross_vocab, schedule=cfg.schedule,
                                 window=cfg.window, backend=replace(backend, weights="codes"))

    def __init__(self, model: torch.nn.Module, num_layers: int | None = None, **settings):
        super().__init__(model, num_layers, **settings)
        # a fixed draft length (no confidence floor, no schedule) drafts from the device alone: read a step late on a
        # GPU (the last two tokens and the lengths are the device's; nothing is read back)
        self.traits = Traits(device_only=self.confidence == 0 and self.schedule == "constant")

    def rounded(self, bits: int | None, target: torch.nn.Module) -> "DraftModelDrafter":
        """This drafter with its decoder layers' weights rounded to ``bits``-bit codes (``drafter.weight_bits``;
        the target's, shared, stay, and so does the LM head, the target's rows, codes already); itself."""
        round_weights(getattr(self.decoder, "layers", self.decoder), bits, keep=tuple(target.parameters()),
                      what="draft model")
        return self

    @staticmethod
    def _options(cfg, path) -> dict:
        from specdec.drafters.draft_model.student import frequent_tokens

        return {"confidence": cfg.confidence, "schedule": cfg.schedule,
                "vocab_ids": frequent_tokens(path, cfg.draft_vocab) if cfg.draft_vocab else None}

    def start(self, state: DecodeState) -> None:
        if self.decoder.vocab_size != state.vocab_size:
            raise VocabMismatchError(
                f"draft model vocabulary ({self.decoder.vocab_size} tokens) differs from the target's "
                f"({state.vocab_size}); a draft model with another tokenizer drafts through CrossVocabDrafter (built "
                f"with both tokenizers, as drafter.path=<the model> does), or use drafter=ngram"
            )
        batch = state.seq.shape[0]
        self.cache = self.decoder.new_cache(batch, state.capacity, state.pad)
        self.length = None
        prefix = state.max_seq_len - 2  # all rows have the same length right after the prompt
        if prefix > 0:
            self.decoder(state.seq[:, :prefix], self.cache, kv_len=prefix, last_only=True)
            self.cache.commit(torch.full_like(state.seq_lens, prefix))
            self.runtime.forwards += 1

    @torch.no_grad()
    def propose(self, state: DecodeState, k: int) -> Proposal:
        params = state.sampling
        if self.schedule == "heuristic":
            self.length = k if self.length is None else min(self.length, k)
            k = self.length
        last_two = state.seq.gather(1, state.seq_lens[:, None] - 2 + torch.arange(2, device=state.seq.device))
        batch = state.seq.shape[0]
        drawn = () if params.greedy else (uniforms(batch, k, state.generator, state.seq.device),)
        inputs = (state.seq_lens, last_two, *drawn)
        # a confidence floor reads each draft back: drafted eagerly, each forward replaying its own graph if any
        stop = partial(self._unsure, params=params, active=state.active) if self.confidence else None
        if stop is None and replays_graphs(self.decoder, self.cache):  # the whole chain, K forwards and draws: a graph
            run = partial(self.chain, self.decoder.captured_forward, None, k, params, None)
            tokens, *probs = self.runtime.call(run, inputs, key=("chain", k, params))
        else:
            tokens, *probs = self.chain(self.decoder, state.max_seq_len, k, params, stop, *inputs)
        self.runtime.forwards += tokens.shape[1]
        self.proposed = tokens.shape[1]
        return Proposal(tokens=tokens, probs=probs[0] if probs else None, num_proposed=[tokens.shape[1]] * batch)

    def chain(self, forward: Callable, kv_len: int | None, k: int, params: SamplingParams, stop: Callable | None,
              seq_lens: torch.Tensor, last_two: torch.Tensor, *drawn: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Up to ``k`` drafts per row (fewer where ``stop(logits, token, q)`` says so, a host read): the draft cache
        rolled back to ``seq_lens - 2`` [B], then fed the rows' last two tokens ``last_two`` [B, 2] and each draft
        but the last through ``forward`` (the draft's decoder, eager with ``kv_len`` the slots its first forward
        reaches, or graphed with None). The i-th draft is drawn with ``drawn[0][:, i]`` (uniforms [B, k], drawn before:
        none under greedy decoding). Returns the drafts [B, K'] and, when sampling, their q [B, K', V].

        The cache's pointer is set, not moved, before anything is written, so running it again (a graph's warm-up)
        rewrites the same slots and ends at the same lengths: the whole chain replays as one graph."""
        cache = self.cache
        cache.rollback_to(seq_lens - 2)
        logits, _ = forward(last_two, cache, kv_len=kv_len)
        cache.commit(torch.full_like(seq_lens, 2))
        tokens, probs = [], []
        for i in range(k):
            token, q = self.draw(logits[:, -1], params, drawn[0][:, i] if drawn else None)  # [B], [B, V]
            tokens.append(token)
            probs.append(q)
            if i + 1 == k or (stop is not None and stop(logits[:, -1], token, q)):
                break
            logits, _ = forward(token[:, None], cache, kv_len=None if kv_len is None else kv_len + i + 1)
            cache.commit(torch.ones_like(seq_lens))
        tokens = torch.stack(tokens, 1)
        return (tokens,) if params.greedy else (tokens, torch.stack(probs, 1))

    def _unsure(self, logits: torch.Tensor, token: torch.Tensor, q: torch.Tensor | None, params: SamplingParams,
                active: list[bool]) -> bool:
        """Whether every active row's last draft has probability below ``confidence``: q's when sampling, the
        draft's softmax at T=1 under greedy decoding (no q there), as transformers does."""
        if params.greedy:
            p = logits.float().softmax(-1).max(-1).values  # the argmax's probability (restricted head: of its N)
        else:
            p = q.gather(1, token[:, None])[:, 0]
        sure = (p >= self.confidence).tolist()
        return not any(s and a for s, a in zip(sure, active))

    def draw(self, logits: torch.Tensor, params: SamplingParams,  # logits [B, V] (or [B, N]: draft_vocab)
             u: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:  # token [B], q [B, V]
        """One draft token per row and the distribution q it was drawn from, which the verifier is told: the argmax
        under greedy decoding (no q), else drawn with the uniforms ``u`` [B]. With a restricted head q is spread back
        over the whole vocabulary (zero off the head's tokens)."""
        if params.greedy:
            return self.widen(logits.argmax(-1), None, params)
        q = logits_to_probs(logits, params.temperature, params.top_k, params.top_p)
        return self.widen(sample(q, uniforms=u), q, params)

    def widen(self, token: torch.Tensor, q: torch.Tensor | None,  # [B], [B, N] -> [B], [B, V]
              params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A draw over the restricted head's N tokens as one over the whole vocabulary (as is without one)."""
        if self.vocab_ids is None:
            return token, q
        if params.greedy:  # q is not passed on under greedy decoding (the drafts are deterministic)
            return self.vocab_ids[token], q
        full = q.new_zeros(q.shape[0], self.decoder.vocab_size).scatter_(1, self.vocab_ids.expand(q.shape[0], -1), q)
        return self.vocab_ids[token], full
