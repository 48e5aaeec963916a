"""Medusa heads (Cai et al. 2024): H small heads on the target's last hidden state, and their file format.

Head i (i = 0..H-1) reads the target's final hidden state at the position that predicted token t+1 —
``DecodeState.last_hidden``, where ``last_tokens`` was predicted — and proposes token t+2+i. Each head is
a residual block h + SiLU(W h + b) followed by the target's own LM head (frozen and shared; an own LM
head per Medusa head is an option). W and b start at zero, so an untrained head repeats the target's
next-token prediction. A proposal needs no model forward: H small matrix products and the LM head.

**Token-aware heads** (``MedusaHeads(token_aware=True)``, ``python -m specdec.train method.token_aware=true``; the
sequentially dependent heads of Hydra, Ankner et al. 2024): head i also reads the embeddings of the token
the target just emitted and of the i draft tokens on the path before its own, [h; E(x_t+1); ...; E(x_t+1+i)],
through the residual block's linear layer.

Heads are stored as safetensors with their shape and target in the metadata (:func:`save_heads`, format
``specdec-medusa-1``), and a ``tree`` (priority-ordered paths measured on held-out data by
:mod:`specdec.training`).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from specdec.errors import CheckpointError
from specdec.jobs.io import read_metadata, read_tensors
from specdec.models.backend import Backend, ProductPlan

FORMAT = "specdec-medusa-1"
DEFAULT_HEADS = "default"  # the heads shipped for the default target, SmolLM2-135M-Instruct


def default_heads_path() -> Path:
    """The heads shipped inside the package for the default target (``drafter.path=default``), with their tree."""
    return Path(str(resources.files("specdec") / "assets" / "medusa" / "smollm2-135m" / "heads.safetensors"))


class ResBlock(nn.Module):
    """h + SiLU(W x + b), x = h, or for a token-aware head [h; embeddings of the ``known`` tokens before]."""

    def __init__(self, hidden_size: int, known: int = 0):
        super().__init__()
        self.known = known
        self.linear = nn.Linear(hidden_size * (1 + known), hidden_size)
        nn.init.zeros_(self.linear.weight)  # a fresh head is the identity, i.e. the base next-token head
        nn.init.zeros_(self.linear.bias)

    def forward(self, h: torch.Tensor, known: torch.Tensor | None = None,
                backend: Backend = Backend()) -> torch.Tensor:  # [..., H] -> [..., H]
        x = h if not self.known else torch.cat([h, known[..., : self.known, :].flatten(-2)], -1)  # known [..., n, H]
        if not torch.is_grad_enabled():  # drafting: the product on ``backend`` (training: F.linear)
            return h + F.silu(backend.linear(x, self.linear))
        return h + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """``num_heads`` residual blocks, then the shared LM head (passed at call time) or an own one each.

    ``token_ids`` (optional, [V'] long): a *draft vocabulary* — the heads score only these tokens (the
    rows of the LM head they select), e.g. the V' most frequent tokens in the target's answers, as in
    FR-Spec (Zhao et al. 2025). Drafting and training then cost V'/V of the full LM head; a token outside
    the draft vocabulary can never be proposed, which costs acceptance only where the target emits a rare
    token. Verification is unchanged and stays exact: the target still scores its full vocabulary.

    ``backend``: how drafting's CPU products run (its drafter's, set by
    :class:`~specdec.drafters.medusa.drafter.MedusaDrafter`); the target's LM-head rows are read as codes where
    they are codes and the backend's weights are ``"codes"``.
    """

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, own_lm_head: bool = False,
                 token_ids: torch.Tensor | None = None, token_aware: bool = False):
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"num_heads must be >= 1, got {num_heads}")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        if token_ids is not None:
            token_ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
            if not 0 < token_ids.numel() < vocab_size or int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab_size \
                    or token_ids.unique().numel() != token_ids.numel():
                raise ValueError(f"token_ids must be fewer than {vocab_size} distinct token ids in [0, {vocab_size}) "
                                 f"(None = the full vocabulary), got {token_ids.numel()} "
                                 f"ids in [{int(token_ids.min()) if token_ids.numel() else '-'}, "
                                 f"{int(token_ids.max()) if token_ids.numel() else '-'}]")
            self.register_buffer("token_ids", token_ids)
        else:
            self.token_ids = None
        self.draft_vocab_size = vocab_size if token_ids is None else token_ids.numel()
        self.token_aware = token_aware
        self.blocks = nn.ModuleList(ResBlock(hidden_size, i + 1 if token_aware else 0) for i in range(num_heads))
        self.lm_heads = nn.ModuleList(nn.Linear(hidden_size, self.draft_vocab_size, bias=False)
                                      for _ in range(num_heads)) if own_lm_head else None
        self.backend = Backend()
        self._stacked: dict[tuple, tuple] = {}  # see _blocks_in_one

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def draft_lm_head(self, lm_head_weight: torch.Tensor) -> torch.Tensor:  # [V, H] -> [V', H]
        """The rows of the target's LM head that score the draft vocabulary (all of it without one)."""
        return lm_head_weight if self.token_ids is None else lm_head_weight[self.token_ids].contiguous()

    def to_token_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Indices into the draft vocabulary -> the target's token ids."""
        return index if self.token_ids is None else self.token_ids[index]

    def init_lm_heads(self, lm_head_weight: torch.Tensor) -> None:  # [V, H]
        """Start every own LM head as a copy of the target's (its draft-vocabulary rows)."""
        if self.lm_heads is not None:
            for head in self.lm_heads:
                head.weight.data.copy_(self.draft_lm_head(lm_head_weight))

    def forward(
        self,
        hidden: torch.Tensor,  # [..., H] target final hidden states
        lm_head_weight: torch.Tensor,  # [V, H] the target's (frozen) LM head, or its draft_lm_head() rows [V', H]
        num_heads: int | None = None,  # use the first heads only
        known: torch.Tensor | None = None,  # token-aware heads: [..., >= h, H] embeddings of the tokens before
        first: int = 0,  # start at this head (token-aware drafting evaluates one head at a time)
    ) -> torch.Tensor:  # [..., num_heads, V'] logits over the draft vocabulary (V' = V without one)
        """Each head's logits. A token-aware head i also reads ``known[..., :i+1]``: the embeddings of the
        token the target just emitted and of the i tokens after it (teacher-forced in training, the draft
        path when drafting)."""
        if self.token_aware and known is None:
            raise ValueError("token-aware Medusa heads need the embeddings of the known tokens (known=...)")
        blocks = self.blocks[first: num_heads or self.num_heads]
        z = self._blocks_in_one(hidden, first, len(blocks))
        if z is None:
            z = torch.stack([block(hidden, known, self.backend) for block in blocks], -2)  # [..., h, H]
        if self.lm_heads is not None:
            return torch.stack([head(z[..., i, :]) for i, head in enumerate(self.lm_heads[first: first + len(blocks)])], -2)
        if self.token_ids is not None and lm_head_weight.shape[0] == self.vocab_size:
            lm_head_weight = self.draft_lm_head(lm_head_weight)  # callers in a loop pass the rows, sliced once
        flat = z.reshape(-1, z.shape[-1])  # [R, H]
        logits = self.backend.rows_product(flat, lm_head_weight)  # specdec's CPU kernel, drafting in float32
        if logits is None:  # on CPU W·zᵀ rather than z·Wᵀ: the same product, several times faster for a few rows
            logits = (F.linear(flat, lm_head_weight) if self.backend.runs_as_accelerator(flat)
                      else torch.mm(lm_head_weight, flat.t()).t())
        return logits.reshape(*z.shape[:-1], -1)

    def _blocks_in_one(self, hidden: torch.Tensor, first: int, count: int) -> torch.Tensor | None:
        """The residual blocks ``first`` .. ``first + count - 1`` over ``hidden`` [..., H] -> [..., count, H] in one
        kernel where three a head run otherwise (the Triton kernels' ``residual_silu_product`` over their weights and
        biases stacked once, again when one is replaced or updated in place: :class:`ProductPlan`), or None where it
        does not run (token-aware heads, autograd, the CPU)."""
        kernels = None if self.token_aware else self.backend.fused_kernels(hidden)
        in_one = getattr(kernels, "residual_silu_product", None)
        if in_one is None or hidden.dtype != self.blocks[first].linear.weight.dtype:
            return None
        key = (first, count, hidden.dtype, hidden.device)
        held = self._stacked.get(key)
        if held is None or not held[0].current(self.backend):
            plan = ProductPlan(self.backend, hidden.dtype, stacked=True)
            entries = [plan.group(block, "linear")[0] for block in self.blocks[first:first + count]]
            held = self._stacked[key] = (plan, torch.cat([entry.weight for entry in entries]),
                                         torch.cat([entry.bias for entry in entries]))
        width = hidden.shape[-1]
        return in_one(hidden.reshape(-1, width), held[1], held[2]).view(*hidden.shape[:-1], count, width)


def save_heads(path: str | Path, heads: MedusaHeads, *, target: str = "", tree: list[list[int]] | None = None,
               extra: dict[str, Any] | None = None, dtype: torch.dtype | None = None) -> None:
    """Write ``heads`` as safetensors (atomically: a temporary file, then a rename); ``dtype`` (e.g.
    torch.float16, half the file) stores the weights in it. Loading casts them to the heads' dtype."""
    path = Path(path)
    meta = {"format": FORMAT, "hidden_size": heads.hidden_size, "vocab_size": heads.vocab_size,
            "draft_vocab_size": heads.draft_vocab_size, "num_heads": heads.num_heads,
            "own_lm_head": heads.lm_heads is not None, "token_aware": heads.token_aware, "target": target,
            "tree": tree, **(extra or {})}
    tensors = {name: t.detach().cpu().to(dtype if dtype and t.is_floating_point() else t.dtype).contiguous()
               for name, t in heads.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata={"specdec": json.dumps(meta)})
    tmp.replace(path)


def load_heads(path: str | Path, *, hidden_size: int, vocab_size: int) -> tuple[MedusaHeads, dict[str, Any]]:
    """Load heads saved by :func:`save_heads` for a target of ``hidden_size`` and ``vocab_size``.

    Raises :class:`~specdec.errors.CheckpointError` (a ValueError) naming the file when it is not a heads
    file specdec wrote, is corrupt, or was trained for a target of another shape.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "heads.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"no Medusa heads at {str(path)!r}; train some with `python -m specdec.train "
                                f"method=medusa` or use drafter.path={DEFAULT_HEADS} for the default target's")
    hint = (f"point drafter.path at what `python -m specdec.train method=medusa` wrote (its output or export "
            f"directory, or the heads.safetensors in it), or use drafter.path={DEFAULT_HEADS} for the default target's")
    meta = json.loads(read_metadata(path, what="Medusa heads file", hint=hint).get("specdec", "{}"))
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{str(path)!r} is not a specdec Medusa heads file (format {meta.get('format')!r}, "
                              f"expected {FORMAT!r}); {hint}")
    if (meta["hidden_size"], meta["vocab_size"]) != (hidden_size, vocab_size):
        raise CheckpointError(
            f"Medusa heads {str(path)!r} were trained for a target with hidden size {meta['hidden_size']} and "
            f"vocabulary {meta['vocab_size']} (target {meta.get('target') or 'unknown'!r}), but this target has "
            f"hidden size {hidden_size} and vocabulary {vocab_size}; train heads for it with "
            f"`python -m specdec.train method=medusa target=<this target>`"
        )
    tensors = read_tensors(path, what="Medusa heads file", hint=hint, finite=True)
    heads = MedusaHeads(hidden_size, vocab_size, meta["num_heads"], own_lm_head=meta["own_lm_head"],
                        token_ids=tensors.get("token_ids"), token_aware=meta.get("token_aware", False))
    heads.load_state_dict(tensors)
    return heads.eval().requires_grad_(False), meta
