"""A draft model with another tokenizer than the target's, exact at every temperature (``drafter=draft_model`` with a
``path`` whose tokenizer differs; ``drafter.cross_vocab`` picks the rule).

The draft reads the committed text, not the target's ids: before each proposal the target's tokens are spelled out
(:class:`~specdec.drafters.draft_model.vocab_map.VocabMap`) and the text tokenised by the draft's own tokenizer; its
static cache keeps the longest prefix that tokenisation shares with what it holds (a pointer move) and the rest is
fed in one forward. A character whose bytes are not all committed yet waits for the token that completes it.

Two rules turn the draft's tokens into target tokens the verifier checks:

- ``intersection`` (token-level intersection, TLI; Timor et al., ICML 2025): the draft samples from its
  distribution restricted to the tokens that spell a target token and renormalised there, and each draft is that
  target token, with q the same law written over the target's vocabulary. Exact rejection sampling needs only that
  every draft is drawn from the q reported; it holds at any temperature, top-k and top-p. Draft tokens the target
  cannot spell in one token (SmolLM2's newline-plus-indent tokens for Gemma) are never proposed.
- ``string`` (greedy decoding only; string-level matching, as transformers' universal assisted generation): the
  draft writes K tokens greedily over its whole vocabulary, the target's tokenizer re-tokenises that text and the
  verifier keeps the longest prefix equal to the target's own argmax. Under greedy decoding any proposal is exact;
  this one reaches text the intersection cannot.

``auto`` takes ``string`` under greedy decoding and ``intersection`` when sampling.

**Window.** With ``window`` = N > 0 the draft reads each row's text from the start of the prompt's last N draft tokens
on: its first forward, a prefill of the prompt as costly as the target's own (a draft half the target's size), then
covers N tokens, not the whole prompt. The origin is fixed for the generation, so every later step keeps the cache's
prefix as before. What the draft reads changes the drafts only, never the output.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from specdec.drafters.base import DRAFTERS, DecodeState, DraftRuntime, Proposal
from specdec.drafters.draft_model.core import ModelDrafter
from specdec.drafters.draft_model.vocab_map import VocabMap, complete_utf8
from specdec.models.backend import Backend
from specdec.verify.sampling import SamplingParams, logits_to_probs, sample

log = logging.getLogger(__name__)

RULES = ("auto", "intersection", "string")  # drafter.cross_vocab (the draft model's config adds off: refuse)


class CrossVocabDrafter(ModelDrafter):
    """``model`` (a causal LM or decoder) drafting through ``vocab_map`` for a target with another tokenizer."""

    def __init__(self, model: torch.nn.Module, draft_tokenizer: Any, target_tokenizer: Any, *, rule: str = "auto",
                 schedule: str = "constant", window: int = 0, vocab_map: VocabMap | None = None,
                 backend: Backend = Backend()):
        if rule not in RULES:
            raise ValueError(f"drafter.cross_vocab must be one of {list(RULES) + ['off']}, got {rule!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"drafter.window must be an integer >= 0 (the draft tokens of the prompt the draft reads; "
                             f"0 = all), got {window!r}")
        super().__init__(model, schedule=schedule, backend=backend)
        if vocab_map is None:
            vocab_map = VocabMap(draft_tokenizer, target_tokenizer, draft_size=self.decoder.vocab_size)
        self.tokenizer, self.target_tokenizer, self.rule = draft_tokenizer, target_tokenizer, rule
        self.window = window
        self.origins: list[int] = []  # per row, the character its draft text starts at (set at a generation's first step)
        vocab_map.check()
        self.use_map(vocab_map)
        # the draft runs eagerly: its catch-up forwards take as many tokens as the text re-tokenised gives, a shape per
        # step that graphs would capture anew
        self.runtime = DraftRuntime(backend)
        self.held: list[list[int]] = []  # per row, the draft tokens its draft cache holds, in order
        log.info("cross-vocabulary draft: %s", vocab_map.describe())

    @classmethod
    def from_config(cls, cfg, target=None, tokenizer=None, backend=Backend()) -> "CrossVocabDrafter":
        """What the draft model's config (``drafter=cross_vocab`` presets it) builds for a draft whose tokenizer
        differs from the target's ``tokenizer``: the drafter registered as ``draft_model`` loads the draft and,
        seeing another tokenizer, builds this one; a draft sharing the target's tokenizer is refused here."""
        drafter = DRAFTERS["draft_model"].from_config(cfg, target, tokenizer, backend)
        if not isinstance(drafter, cls):
            raise ValueError(f"drafter.path={cfg.path!r} shares the target's tokenizer: it drafts as drafter=draft_model, "
                             f"not across vocabularies")
        return drafter

    def use_map(self, vocab_map: VocabMap) -> None:
        """Draft through ``vocab_map``: its pairs, the shared draft ids [N] and the mask of the others [V_draft]."""
        self.map = vocab_map.to(self.decoder.device)
        self.shared_ids = self.map.shared_ids[self.map.shared_ids < self.decoder.vocab_size]
        self.unshared = ~self.map.shared[: self.decoder.vocab_size]  # never drafted by the intersection

    def rule_for(self, params: SamplingParams) -> str:
        if self.rule == "string" and not params.greedy:
            raise ValueError("drafter.cross_vocab=string is exact under greedy decoding only (a re-tokenised draft "
                             "has no q to verify with); use drafter.cross_vocab=intersection or auto when sampling")
        if self.rule == "auto":
            return "string" if params.greedy else "intersection"
        return self.rule

    def start(self, state: DecodeState) -> None:
        self.rule_for(state.sampling)  # refuse a bad rule before the first step
        batch, device = state.seq.shape[0], state.seq.device
        # the draft's tokens can outnumber the target's for the same text (a smaller vocabulary): room for both
        self.capacity = 2 * state.capacity + 64
        self.cache = self.decoder.new_cache(batch, self.capacity, torch.zeros(batch, dtype=torch.long, device=device))
        self.held = [[] for _ in range(batch)]
        self.origins = []
        self.length = None

    def _contexts(self, state: DecodeState) -> list[list[int]]:
        """Each row's committed text from its origin on as the draft tokenises it (its BOS first where its tokenizer
        adds one)."""
        texts = [complete_utf8(self.map.target_text(tokens))[0] for tokens in state.tokens]
        if len(self.origins) != len(texts):  # a generation's first step
            self.origins = [self._origin(text) for text in texts]
        return [self.tokenizer.encode(text[origin:], add_special_tokens=True)
                for text, origin in zip(texts, self.origins)]

    def _origin(self, text: str) -> int:
        """Where a row's draft text starts: the first character of the last ``window`` draft tokens of ``text``
        (0: all of it, or no window)."""
        if not self.window:
            return 0
        try:
            spans = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        except NotImplementedError:  # a slow tokenizer: about four characters a token
            return max(0, len(text) - 4 * self.window)
        return spans[-self.window][0] if len(spans) > self.window else 0

    def _catch_up(self, contexts: list[list[int]]) -> torch.Tensor:
        """Bring each row's draft cache to its context, keeping the prefix it shares with what the cache holds (a
        pointer move) and feeding the rest; the logits after each context [B, V]."""
        longest = max(len(context) for context in contexts)
        if longest + 16 > self.capacity:
            raise ValueError(f"the draft's tokenisation of the text ({longest} tokens) outgrew its cache "
                             f"({self.capacity} slots)")
        kept = []
        for held, context in zip(self.held, contexts):
            same = 0
            for a, b in zip(held, context[:-1]):  # the last token is always fed: its logits draft
                if a != b:
                    break
                same += 1
            kept.append(same)
        device = self.cache.lengths.device
        self.cache.rollback_to(torch.tensor(kept, device=device))
        fresh = [context[same:] for same, context in zip(kept, contexts)]
        if len({len(tokens) for tokens in fresh}) == 1:  # one forward, every row's last token in the last column
            logits = self._feed(fresh, longest)
        else:  # rows of unequal lengths: all but each row's last token (right-padded), then the last tokens
            self._feed([tokens[:-1] for tokens in fresh], longest - 1)
            logits = self._feed([tokens[-1:] for tokens in fresh], longest)
        self.held = [list(context) for context in contexts]
        return logits

    def _drafted(self, drafts: list[torch.Tensor]) -> None:
        """The draft tokens fed after the catch-up ([B] each), added to what each row's cache holds (one host read
        a step, not one a draft)."""
        if drafts:
            for held, tokens in zip(self.held, torch.stack(drafts, 1).tolist()):
                held.extend(tokens)

    def _feed(self, rows: list[list[int]], kv_len: int) -> torch.Tensor | None:
        """Write ``rows`` (right-padded; each row's own count committed) into the draft cache; the logits after
        the last column [B, V] (a row's own last token's only where all rows have the same length)."""
        width = max(len(tokens) for tokens in rows)
        if width == 0:
            return None
        device = self.cache.lengths.device
        block = torch.tensor([tokens + [0] * (width - len(tokens)) for tokens in rows], dtype=torch.long,
                             device=device)
        logits, _ = self.decoder(block, self.cache, kv_len=kv_len, last_only=True)
        self.cache.commit(torch.tensor([len(tokens) for tokens in rows], device=device))
        self.runtime.forwards += 1
        return logits[:, -1]

    def _step(self, tokens: torch.Tensor, kv_len: int) -> torch.Tensor:  # [B] -> [B, V]
        """Feed one drafted token per row (``kv_len``: the longest row's slots after it); the logits after it."""
        logits, _ = self.decoder(tokens[:, None], self.cache, kv_len=kv_len)
        self.cache.commit(torch.ones_like(tokens))
        self.runtime.forwards += 1
        return logits[:, -1]

    @torch.no_grad()
    def propose(self, state: DecodeState, k: int) -> Proposal:
        params = state.sampling
        if self.schedule == "heuristic":
            self.length = k if self.length is None else min(self.length, k)
            k = self.length
        logits = self._catch_up(self._contexts(state))
        if self.rule_for(params) == "string":
            return self._propose_string(logits, k, state)
        return self._propose_shared(logits, k, params, state)

    def _propose_shared(self, logits: torch.Tensor, k: int, params: SamplingParams, state: DecodeState) -> Proposal:
        """Token-level intersection: draws from the draft's law over its shared tokens, renormalised there."""
        tokens, probs, fed = [], [], []
        longest = max(len(held) for held in self.held)
        for i in range(k):
            law, reported = self.laws(logits, params)  # [B, V_draft] each
            drawn = sample(law, state.generator)  # [B]
            tokens.append(self.map.draft_to_target[drawn])
            if not params.greedy:
                probs.append(self.over_target(reported, state.vocab_size))
            if i + 1 < k:
                logits = self._step(drawn, longest + i + 1)
                fed.append(drawn)
        self._drafted(fed)
        self.proposed = len(tokens)
        return Proposal(tokens=torch.stack(tokens, 1), probs=None if params.greedy else torch.stack(probs, 1),
                        num_proposed=[len(tokens)] * len(tokens[0]))

    def laws(self, logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """The law a draft is drawn from and the one reported for it (the same: the draft's sampling law over its
        shared tokens, renormalised there), over the draft's vocabulary [B, V_draft] each."""
        law = logits_to_probs(logits.float().masked_fill(self.unshared, float("-inf")), params.temperature,
                              params.top_k, params.top_p)
        return law, law

    def over_target(self, q: torch.Tensor, vocab: int) -> torch.Tensor:  # [B, V_draft] -> [B, V_target]
        """q written over the target's vocabulary: each shared draft token's mass on its counterpart (summed, were
        two draft tokens to spell the same target token)."""
        return q.new_zeros(q.shape[0], vocab).index_add_(1, self.map.draft_to_target[self.shared_ids],
                                                         q[:, self.shared_ids])

    def _propose_string(self, logits: torch.Tensor, k: int, state: DecodeState) -> Proposal:
        """String-level: k greedy draft tokens over the draft's whole vocabulary, re-tokenised by the target's
        tokenizer per row (at most k target tokens; a row whose committed text ends inside a character proposes
        none, a plain step completes it)."""
        drafted = []
        longest = max(len(held) for held in self.held)
        for i in range(k):
            drafted.append(logits.argmax(-1))
            if i + 1 < k:
                logits = self._step(drafted[-1], longest + i + 1)
        self._drafted(drafted[:-1])
        rows = []
        for b, tokens in enumerate(torch.stack(drafted, 1).tolist()):
            if complete_utf8(self.map.target_text(state.tokens[b][-4:]))[1]:
                rows.append([])
                continue
            text, _ = complete_utf8(self.map.draft_text(tokens))
            rows.append(self.target_tokenizer.encode(text, add_special_tokens=False)[:k] if text else [])
        width = max(len(ids) for ids in rows)
        self.proposed = width
        block = [ids + [0] * (width - len(ids)) for ids in rows]
        return Proposal(tokens=torch.tensor(block, dtype=torch.long, device=state.seq.device).view(len(rows), width),
                        num_proposed=[len(ids) for ids in rows])
