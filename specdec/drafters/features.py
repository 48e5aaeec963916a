"""What the drafters over the target's features share (EAGLE's draft layer, the block drafter): the target's input
embeddings attached rather than owned, a draft vocabulary mapped to target ids, Llama's rotary embedding, and
writing the weights with that map.

A *draft vocabulary* is the Dv target tokens the drafter's own LM head scores (the most frequent in its training
data); ``d2t`` holds offsets, the target id of draft index i being ``i + d2t[i]`` (the speculators format's table),
all zero for the full vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from specdec.errors import CheckpointError, VocabMismatchError
from specdec.models import fused


class FeatureDraftModel(nn.Module):
    """Base of a draft model over the target's features: :meth:`attach`, the draft vocabulary (``d2t``,
    :meth:`set_token_ids`, :attr:`token_ids`), :meth:`rope` and the draft :meth:`logits`. ``what`` names it in
    errors. A subclass has ``fc`` (the features' fusion), ``norm`` and ``lm_head`` (its final norm and draft LM
    head), ``backend`` and ``_layer_plan(stacked)`` (what its fused forwards read, with "norm" and
    "lm_head" among it: :class:`~specdec.models.backend.ProductPlan`)."""

    what = "drafter"

    def __init__(self, vocab_size: int, hidden_size: int, draft_vocab_size: int, head_dim: int, rope_theta: float):
        super().__init__()
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        inv_freq = 1.0 / rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.embed_weight: torch.Tensor | None = None  # [V, H] the target's, frozen (see attach)
        self.embed_scale = 1.0  # what the target's embedding multiplies its rows by (Gemma: √hidden; see attach)
        self._rope_tables: dict = {}  # (dtype, device) -> the rotary embedding's table (see rope)
        self._rope_tables_kept: list = []  # every table made: graphs captured over one still read it

    def attach(self, embed_weight: torch.Tensor, scale: float = 1.0):
        """Read token embeddings from the target's ``embed_weight`` [V, H] (shared, never trained here), times
        ``scale`` as the target's embedding gives them (√hidden for Gemma's scaled embedding, else 1)."""
        if tuple(embed_weight.shape) != (self.vocab_size, self.hidden_size):
            raise ValueError(f"the target's embeddings are {list(embed_weight.shape)}, the {self.what} expects "
                             f"[{self.vocab_size}, {self.hidden_size}]")
        self.embed_weight = embed_weight.detach()
        self.embed_scale = float(scale)
        return self

    def set_token_ids(self, token_ids: torch.Tensor | None) -> None:
        """The draft vocabulary: target ids [Dv] ascending (None = the full vocabulary)."""
        if token_ids is None:
            self.d2t.zero_()
        else:
            self.d2t.copy_(token_ids.to(self.d2t) - torch.arange(token_ids.numel(), device=self.d2t.device))

    @property
    def token_ids(self) -> torch.Tensor:  # [Dv] long: the target id of each draft index
        return self.d2t + torch.arange(self.d2t.numel(), device=self.d2t.device)

    def _scaled(self, embeds: torch.Tensor) -> torch.Tensor:
        """The target's embeddings as its embedding module gives them (as its own dtype rounds the scale)."""
        return embeds if self.embed_scale == 1.0 else embeds * torch.tensor(self.embed_scale, dtype=embeds.dtype)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype, within: int | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, 1, T, D] of ``positions`` [B, T] (Llama's default rotary embedding). ``within``: a bound on
        the positions (a cache's capacity); on the Triton kernels' devices (:meth:`Backend.stacks`) and without
        autograd they are then the rows of a table of every position below it, computed once by the same ops (the
        same values, elementwise): two gathers where the computation is seven kernels a forward."""
        if within is not None and self.backend.stacks(positions) and not torch.is_grad_enabled():
            cos, sin = self._rope_table(within, dtype, positions.device)
            return cos[positions][:, None], sin[positions][:, None]
        freqs = positions[..., None].float() * self.inv_freq  # [B, T, D/2]
        emb = torch.cat([freqs, freqs], -1)[:, None]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def rope_at(self, positions: torch.Tensor, dtype: torch.dtype, within: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The fused forwards' rotary embedding of ``positions`` [B, T] below ``within``: on the Triton kernels'
        devices without autograd the tables [P, D] (:meth:`_rope_table`) and the positions [B·T] the attention kernel
        reads their rows at (no gather before it: ``fused.Attention.positions``); else cos, sin [B·T, D] and None."""
        if self.backend.stacks(positions) and not torch.is_grad_enabled():
            return *self._rope_table(within, dtype, positions.device), positions.reshape(-1)
        cos, sin = self.rope(positions, dtype, within)
        return cos.reshape(positions.numel(), -1), sin.reshape(positions.numel(), -1), None

    def _rope_table(self, within: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [P, D] of positions 0 .. P - 1 (P ≥ ``within``), kept for the model's lifetime: a captured graph
        reads the table it was captured with, so none is freed while the model lives (one a dtype and device, grown
        by a larger bound)."""
        key = (dtype, str(device))
        held = self._rope_tables.get(key)
        if held is None or held[0].shape[0] < within or held[2] is not self.inv_freq:
            freqs = torch.arange(within, device=device)[:, None].float() * self.inv_freq.to(device)
            emb = torch.cat([freqs, freqs], -1)
            held = (emb.cos().to(dtype), emb.sin().to(dtype), self.inv_freq)
            self._rope_tables[key] = held
            self._rope_tables_kept.append(held)
        return held[0], held[1]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., Dv] float32
        """The draft LM head over the final norm of ``hidden``: through the fused kernels where :meth:`_fused`."""
        kernels = self._fused(hidden)
        if kernels is not None:
            plan = self._plan_for(hidden)
            return fused.normed_product(self.backend, kernels, hidden, plan["norm"], plan["lm_head"])
        return self.backend.linear(self.norm(hidden), self.lm_head).float()

    def _fused(self, x: torch.Tensor):
        """The kernel set a forward (or the logits) on ``x`` [..., H] runs through, as the target's decode step
        (:meth:`CompactDecoder._fused_layers`), or None: the backend's (:meth:`Backend.fused_kernels`: no autograd,
        not traced by torch.compile), the CPU's for a step's few rows only (``Backend.attends_in_kernel``)."""
        kernels = self.backend.fused_kernels(x)
        if (kernels is None or self.fc.weight.dtype != self.embed_weight.dtype
                or not self.backend.attends_in_kernel(kernels, x.numel() // x.shape[-1])):
            return None
        return kernels

    def _plan_for(self, x: torch.Tensor) -> dict:
        """The fused forwards' plan for inputs like ``x``: its products stacked for ``F.linear`` on the Triton
        kernels' devices (:meth:`Backend.stacks`), packed for the CPU kernels elsewhere."""
        return self._layer_plan(self.backend.stacks(x))


def check_state(state, cfg, what: str) -> None:
    """A generation's ``state`` (:class:`~specdec.drafters.base.DecodeState`) as a drafter over ``cfg``'s feature
    layers reads it: the target's vocabulary and the features of those layers, else an error naming both."""
    if state.vocab_size != cfg.vocab_size:
        raise VocabMismatchError(f"the {what} was trained for a vocabulary of {cfg.vocab_size} tokens, the target has "
                                 f"{state.vocab_size}; train one for this target")
    width = len(cfg.aux_layers) * cfg.target_hidden_size
    if state.features is None or state.features.shape[-1] != width:
        got = None if state.features is None else state.features.shape[-1]
        raise ValueError(f"the {what} reads {width} target features per position (layers {list(cfg.aux_layers)} x "
                         f"{cfg.target_hidden_size}), the decode loop gave {got}")


def embedding_scale(embedding: nn.Module) -> float:
    """The factor a target's input embedding module multiplies its rows by: √hidden for Gemma's scaled embedding
    (``scalar_embed_scale``), else 1."""
    return float(getattr(embedding, "scalar_embed_scale", 1.0))


def on_target(model: FeatureDraftModel, target: nn.Module) -> torch.Tensor:
    """``model`` moved to the target's device and dtype and attached to its input embeddings (scaled as its embedding
    module scales them: √hidden for Gemma's); returns the embedding weight (shared: never rounded or trained)."""
    from specdec.models import as_decoder

    decoder = as_decoder(target)
    embedding = decoder.embed_tokens if hasattr(decoder, "embed_tokens") else target.get_input_embeddings()
    weight = embedding.weight
    model.to(device=weight.device, dtype=weight.dtype).attach(weight, embedding_scale(embedding))
    return weight


def save_weights(directory: Path, model: FeatureDraftModel, dtype: torch.dtype | None = None) -> None:
    """``model``'s weights to ``directory/model.safetensors`` (atomically), in ``dtype`` if given; a draft vocabulary
    as ``d2t`` (and ``t2d``: which target ids are draft tokens), none for the full vocabulary."""
    tensors = {name: t.detach().cpu().to(dtype if dtype and t.is_floating_point() else t.dtype).contiguous()
               for name, t in model.state_dict().items() if name != "d2t"}
    if model.d2t.numel() != model.vocab_size:
        tensors["d2t"] = model.d2t.detach().cpu().contiguous()
        t2d = torch.zeros(model.vocab_size, dtype=torch.bool)
        t2d[model.token_ids.cpu()] = True
        tensors["t2d"] = t2d
    tmp = directory / ".model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(directory / "model.safetensors")


def load_weights(model: FeatureDraftModel, tensors: dict[str, torch.Tensor], d2t: torch.Tensor | None, weights: Path,
                 described: str, hint: str) -> FeatureDraftModel:
    """``tensors`` (read from ``weights``, ``d2t`` popped from them) into ``model`` in float32: every tensor its
    config implies, of its shape, and no other, else :class:`~specdec.errors.CheckpointError` naming what differs
    (``described``: what the file should hold; ``hint``: what to do)."""
    state = model.state_dict()
    missing, unexpected = sorted(set(state) - set(tensors) - {"d2t"}), sorted(set(tensors) - set(state))
    if missing or unexpected:
        raise CheckpointError(f"{str(weights)!r} does not match {described}: missing {missing[:6]}, unexpected "
                              f"{unexpected[:6]}; {hint}")
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(state[name].shape):
            raise CheckpointError(f"{str(weights)!r}: {name} has shape {list(tensor.shape)}, its config implies "
                                  f"{list(state[name].shape)}; {hint}")
        state[name] = tensor.float()
    if d2t is not None:
        state["d2t"] = d2t
    model.load_state_dict(state)
    return model


def draft_to_target(d2t: torch.Tensor | None, t2d: torch.Tensor | None, cfg, weights: Path,
                    hint: str) -> torch.Tensor | None:
    """The offsets ``d2t`` [Dv] long of a file's draft vocabulary (target id of draft index i: i + d2t[i]), for a
    config with ``draft_vocab_size`` and ``vocab_size``: the file's ``d2t``, else read off its ``t2d`` [V] bool
    (which target ids are draft tokens, ascending); None for a drafter over the whole vocabulary. Without either,
    a draft vocabulary smaller than the target's would silently map draft index i to target id i: garbage drafts,
    so that raises (``hint``: what to do)."""
    dv, v = cfg.draft_vocab_size, cfg.vocab_size
    if d2t is None and t2d is not None and tuple(t2d.shape) == (v,) and int(t2d.bool().sum()) == dv:
        ids = t2d.bool().nonzero().flatten()
        d2t = ids - torch.arange(dv)
    if d2t is None:
        if dv == v:
            return None
        raise CheckpointError(f"{str(weights)!r} has no d2t (nor a t2d of {dv} draft tokens) though its config's "
                              f"draft_vocab_size {dv} is not its vocab_size {v}: without it the draft tokens "
                              f"cannot be mapped to the target's; restore the file the training run wrote (save_eagle "
                              f"writes d2t and t2d), or {hint}")
    ids = d2t.long() + torch.arange(dv) if tuple(d2t.shape) == (dv,) else None
    if ids is None or ids.min() < 0 or ids.max() >= v:
        raise CheckpointError(f"{str(weights)!r}: d2t (shape {list(d2t.shape)}) is not {dv} offsets to target ids "
                              f"in [0, {v}); restore the file the training run wrote, or {hint}")
    return d2t.long()


def check_target(cfg, target_config, directory: Path, *, what: str, method: str) -> None:
    """A feature drafter's config (``target_hidden_size``, ``vocab_size``, ``aux_layers``, ``hidden_size``, the
    target's layer count in ``extra``) against the target's transformers config: a drafter trained for another
    target raises :class:`~specdec.errors.CheckpointError` naming both and the training command (``method``)."""
    layers = int(target_config.num_hidden_layers)
    mine = (cfg.target_hidden_size, cfg.vocab_size, cfg.extra.get("target_num_layers", layers))
    theirs = (int(target_config.hidden_size), int(target_config.vocab_size), layers)
    if mine != theirs or max(cfg.aux_layers) > layers or cfg.hidden_size != theirs[0]:
        raise CheckpointError(
            f"the {what} at {str(directory)!r} was trained for a target with hidden size {mine[0]}, vocabulary "
            f"{mine[1]} and {mine[2]} layers (feature layers {list(cfg.aux_layers)}; target "
            f"{cfg.target or 'unknown'!r}), but this target has hidden size {theirs[0]}, vocabulary {theirs[1]} and "
            f"{theirs[2]} layers; train one for it with `python -m specdec.train method={method} target=<this target>`")
