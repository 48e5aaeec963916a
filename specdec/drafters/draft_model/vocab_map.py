"""Two tokenizers' vocabularies compared as strings: what a draft model with another tokenizer may propose.

Every token of a tokenizer spells some bytes. :func:`token_bytes` reads them from the tokenizer's own rules, not from
``decode`` (which turns a token holding part of a UTF-8 character into U+FFFD): a byte-level BPE (GPT-2, Llama-3,
SmolLM2) spells each byte as one printable character (``Ġ`` is the space); a SentencePiece-style BPE (Gemma, Llama-2)
writes the space as ``▁`` and a byte it has no token for as ``<0xNN>`` (byte fallback). Special tokens (BOS, EOS,
chat markers, unused slots) spell nothing: they are control symbols, not text, and never cross.

:class:`VocabMap` pairs a draft token with the target token that spells exactly the same bytes (the token-level
intersection of Timor et al., ICML 2025): strings decide, never ids, and a draft token with no exact counterpart has
none (-1), never a neighbour (the same word without its leading space is another string). Where the target spells
the same bytes two ways (a word token and its byte-fallback spelling) the word token is the counterpart: it is the
one the target's own greedy decoding emits.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Optional

import torch


@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable character for each byte (GPT-2's ``bytes_to_unicode``), inverted."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def _decoder_kinds(spec: Optional[dict]) -> set[str]:
    """The types of a tokenizer.json decoder and of every decoder in its sequence; ``Replace▁`` for ▁ -> space."""
    if not spec:
        return set()
    kinds = {spec.get("type", "")}
    if spec.get("type") == "Replace" and spec.get("pattern", {}).get("String") == "▁" and spec.get("content") == " ":
        kinds.add("Replace▁")
    for inner in spec.get("decoders", None) or ():
        kinds |= _decoder_kinds(inner)
    return kinds


def tokenizer_kind(tokenizer: Any) -> str:
    """``byte_level`` or ``sentencepiece`` (▁ for the space, ``<0xNN>`` byte fallback): how ``tokenizer`` spells
    bytes. Raises ValueError, naming the tokenizer, for any other (a WordPiece, a Unigram without byte fallback)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    spec = json.loads(backend.to_str()).get("decoder") if backend is not None else None
    kinds = _decoder_kinds(spec)
    if "ByteLevel" in kinds:
        return "byte_level"
    if "Replace▁" in kinds or "Metaspace" in kinds:
        return "sentencepiece"
    raise ValueError(f"cross-vocabulary drafting reads each token's bytes from a byte-level BPE or a SentencePiece-"
                     f"style tokenizer; {getattr(tokenizer, 'name_or_path', tokenizer)!r} is neither (decoder "
                     f"{sorted(kinds) or 'none'}): use a draft model with the target's tokenizer, or drafter=ngram")


def _spell(token: str, kind: str) -> Optional[bytes]:
    """The bytes ``token`` (as the vocabulary writes it) spells under ``kind``; None if it spells none."""
    if kind == "byte_level":
        alphabet = _byte_level_alphabet()
        if not all(ch in alphabet for ch in token):
            return None
        return bytes(alphabet[ch] for ch in token)
    if is_byte_fallback(token):
        try:
            return bytes([int(token[3:5], 16)])
        except ValueError:
            pass
    return token.replace("▁", " ").encode("utf-8")


def token_bytes(tokenizer: Any) -> list[Optional[bytes]]:
    """Per token id of ``tokenizer`` (its whole vocabulary, added tokens included) the bytes it spells; None for
    special tokens and ids without a token."""
    kind = tokenizer_kind(tokenizer)
    vocab = tokenizer.get_vocab()
    size = max(len(tokenizer), max(vocab.values()) + 1)
    spelled: list[Optional[bytes]] = [None] * size
    special = set(tokenizer.all_special_ids)
    for added_id, added in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(added, "special", False):
            special.add(added_id)
    for token, token_id in vocab.items():
        if token_id not in special:
            spelled[token_id] = _spell(token, kind) or None
    return spelled


def is_byte_fallback(token: str) -> bool:
    return len(token) == 6 and token.startswith("<0x") and token.endswith(">")


class VocabMap:
    """Draft token id -> the target token id that spells the same bytes, or -1 (see the module docstring).

    ``draft_to_target`` [V_draft] long; ``shared`` [V_draft] bool, the draft tokens with a counterpart; the two
    byte tables (``draft_bytes``, ``target_bytes``) for turning either side's ids into text.
    """

    def __init__(self, draft_tokenizer: Any, target_tokenizer: Any, *, draft_size: int | None = None):
        self.draft_bytes = token_bytes(draft_tokenizer)
        self.target_bytes = token_bytes(target_tokenizer)
        target_tokens = target_tokenizer.convert_ids_to_tokens(list(range(len(self.target_bytes))))
        by_bytes: dict[bytes, int] = {}
        for token_id, spelled in enumerate(self.target_bytes):
            if spelled is None:
                continue
            held = by_bytes.get(spelled)
            # the word token over the byte-fallback spelling of the same byte; else the lower id
            if held is None or (is_byte_fallback(target_tokens[held] or "")
                                and not is_byte_fallback(target_tokens[token_id] or "")):
                by_bytes[spelled] = token_id
        size = max(draft_size or 0, len(self.draft_bytes))
        pairs = [by_bytes.get(spelled, -1) if spelled is not None else -1 for spelled in self.draft_bytes]
        pairs += [-1] * (size - len(pairs))
        self.draft_to_target = torch.tensor(pairs, dtype=torch.long)
        self.shared = self.draft_to_target >= 0  # (the pairs spell the same bytes by construction: check())
        self.shared_ids = self.shared.nonzero()[:, 0]  # [N] draft ids with a counterpart
        self.draft_name = getattr(draft_tokenizer, "name_or_path", "the draft's tokenizer")
        self.target_name = getattr(target_tokenizer, "name_or_path", "the target's tokenizer")

    def check(self) -> None:
        """Raise ValueError, naming the first pair, unless every draft token and its counterpart spell the same
        bytes (an intersection built from ids, or from near-equal strings, fails here)."""
        for draft_id, target_id in enumerate(self.draft_to_target.tolist()):
            if target_id < 0:
                continue
            spelled = self.draft_bytes[draft_id] if draft_id < len(self.draft_bytes) else None
            theirs = self.target_bytes[target_id] if target_id < len(self.target_bytes) else None
            if spelled is None or spelled != theirs:
                raise ValueError(f"the vocabulary map pairs draft token {draft_id} ({spelled!r}) with target token "
                                 f"{target_id} ({theirs!r}), which spells other bytes: a cross-vocabulary draft must "
                                 f"only propose the target token spelling exactly its own text")

    @property
    def num_shared(self) -> int:
        return int(self.shared_ids.numel())

    def to(self, device: torch.device) -> "VocabMap":
        self.draft_to_target = self.draft_to_target.to(device)
        self.shared = self.shared.to(device)
        self.shared_ids = self.shared_ids.to(device)
        return self

    def target_text(self, ids: list[int]) -> bytes:
        """The bytes the target's ``ids`` spell (special tokens spell nothing)."""
        table = self.target_bytes
        return b"".join(table[i] or b"" for i in ids if 0 <= i < len(table))

    def draft_text(self, ids: list[int]) -> bytes:
        """The bytes the draft's ``ids`` spell (special tokens spell nothing)."""
        table = self.draft_bytes
        return b"".join(table[i] or b"" for i in ids if 0 <= i < len(table))

    def describe(self) -> str:
        return (f"{self.num_shared} of the draft's {len(self.draft_bytes)} tokens spell a target token "
                f"({self.draft_name!r} -> {self.target_name!r})")


def complete_utf8(text: bytes) -> tuple[str, int]:
    """``text`` up to its last complete UTF-8 character, as a string (an invalid byte inside becomes U+FFFD), and
    how many trailing bytes were held back (0-3: the start of a character a later token will complete)."""
    held = 0
    for back in range(1, min(3, len(text)) + 1):
        byte = text[-back]
        if byte >> 6 == 0b10:  # a continuation byte: look further back for its lead
            continue
        need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
        held = back if need > back else 0
        break
    return text[: len(text) - held].decode("utf-8", errors="replace"), held
