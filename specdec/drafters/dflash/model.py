"""The block drafter's model (DFlash-style; Chen, Liang, Liu 2026: "Block Diffusion for Flash Speculative
Decoding") and its checkpoint format.

A few decoder layers of the target's width draft a whole *block* of B positions in one forward. The block's
input is the embedding of the newest emitted token (the *anchor*) followed by B − 1 copies of a mask token's
embedding (the target's, shared and frozen); the output at block position i predicts the token i places
after the anchor, so one forward gives B − 1 per-position draft distributions. Attention inside the block is
bidirectional. The target conditions it through its *context*: its hidden states at a few layers (the
feature layers, as EAGLE-3 reads them) at every committed position, concatenated, fused by ``fc`` and normed
(``hidden_norm``), then projected by each draft layer's own ``k_proj``/``v_proj`` into keys and values that
every block query attends to (context injected as K/V, not added to the residual stream). Those context
entries depend on the target alone, so they are written once into the drafter's cache as the target commits
positions, and a draft step runs only the B block positions through the layers.

Layers are Qwen3-shaped (q/k RMSNorm per head, SwiGLU MLP); the draft LM head covers a *draft vocabulary*
(``d2t`` maps draft indices to target ids, as EAGLE's) and starts as the target's rows.

Files: ``config.json`` + ``model.safetensors`` (:func:`save_dflash`, :func:`load_dflash`). The config is a
Qwen3 config with a ``dflash_config`` (``target_layer_ids``, ``block_size``, ``mask_token_id``), as the DFlash
reference drafters are; the weights use their names (``layers.N.self_attn.q_proj``, ``fc``, ``hidden_norm``,
``norm``), plus ``lm_head`` and ``d2t`` for the draft vocabulary, which the reference drafters (sharing the
target's full LM head) do not have: see :func:`save_dflash`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from specdec.drafters.features import FeatureDraftModel, check_target, draft_to_target, load_weights, save_weights
from specdec.errors import CheckpointError
from specdec.jobs.io import read_json_object, read_tensors, write_json
from specdec.models import fused
from specdec.models.backend import Backend, ProductPlan
from specdec.models.cache import KVCache
from specdec.models.compact import _rotate_half

INIT_STD = 0.02  # the draft layers' weights start as normal(0, INIT_STD)
DEFAULT_DFLASH = "default"  # the block drafter shipped for the default target, SmolLM2-135M-Instruct


def default_dflash_path() -> Path:
    """The block drafter shipped inside the package for the default target (``drafter.path=default``)."""
    return Path(str(resources.files("specdec") / "assets" / "dflash" / "smollm2-135m"))


@dataclass
class DFlashConfig:
    hidden_size: int  # the draft layers' (= the target's: the embeddings are shared)
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int  # the target's
    draft_vocab_size: int  # rows of the draft LM head
    aux_layers: tuple[int, ...]  # target layers read (ids as CompactDecoder's ``capture``)
    target_hidden_size: int
    block_size: int  # B: the anchor and B - 1 masked positions, so B - 1 drafts a forward
    mask_token_id: int  # the target token whose embedding fills the masked positions
    # every block position's input also holds the newest committed position's fused context, and every masked
    # one the anchor's embedding (False: the published recipe's inputs, the anchor and the masks alone)
    anchor_inputs: bool = True
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_positions: int = 8192
    target: str = ""  # what it was trained for (informational)
    extra: dict[str, Any] = field(default_factory=dict)  # the target's layer count, the stored tree, ...

    @classmethod
    def for_target(cls, config: Any, *, num_layers: int, block_size: int, mask_token_id: int,
                   aux_layers: tuple[int, ...], draft_vocab_size: int | None = None, anchor_inputs: bool = True,
                   target: str = "") -> "DFlashConfig":
        """Draft layers shaped like ``config``'s (a transformers decoder config)."""
        heads = config.num_attention_heads
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
        return cls(config.hidden_size, config.intermediate_size, num_layers, heads, config.num_key_value_heads,
                   getattr(config, "head_dim", None) or config.hidden_size // heads, config.vocab_size,
                   draft_vocab_size or config.vocab_size, tuple(aux_layers), config.hidden_size, block_size,
                   mask_token_id, anchor_inputs, float(config.rms_norm_eps), float(theta), int(config.max_position_embeddings),
                   target, {"target_num_layers": int(config.num_hidden_layers)})


# attend(layer, q, k, v) -> the layer's attention output [B, Hq, T, D] for the block's queries q and its own
# keys/values k, v [B, Hkv, T, D], given whatever context the caller keeps (a cache, or a training batch's)
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class DFlashLayer(nn.Module):
    """One draft layer: pre-norm attention of the block's queries over the context's and the block's own keys,
    then a SwiGLU MLP. The context's keys and values come from :meth:`context_kv`."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        h, heads, kv_heads, dim = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(h, heads * dim, bias=False)
        self.self_attn.k_proj = nn.Linear(h, kv_heads * dim, bias=False)
        self.self_attn.v_proj = nn.Linear(h, kv_heads * dim, bias=False)
        self.self_attn.o_proj = nn.Linear(heads * dim, h, bias=False)
        self.self_attn.q_norm = nn.RMSNorm(dim, eps=cfg.rms_norm_eps)
        self.self_attn.k_norm = nn.RMSNorm(dim, eps=cfg.rms_norm_eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.input_layernorm = nn.RMSNorm(h, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(h, eps=cfg.rms_norm_eps)
        self.shape = (heads, kv_heads, dim)

    def _heads(self, x: torch.Tensor, count: int, norm: nn.Module | None, cos, sin) -> torch.Tensor:
        b, t, _ = x.shape
        x = x.view(b, t, count, self.shape[2])
        if norm is not None:
            x = norm(x)
        x = x.transpose(1, 2)  # [B, heads, T, D]
        return x if cos is None else x * cos + _rotate_half(x) * sin

    def context_kv(self, context: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   backend: Backend = Backend()) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (normed, rotated) and values [B, Hkv, T, D] of the fused context [B, T, H] at its positions."""
        attn, (_, kv_heads, _) = self.self_attn, self.shape
        k, v = backend.linears(context, (attn.k_proj, attn.v_proj))
        return self._heads(k, kv_heads, attn.k_norm, cos, sin), self._heads(v, kv_heads, None, None, None)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend, index: int,
                backend: Backend = Backend()) -> torch.Tensor:  # x [B, T, H] -> [B, T, H]
        b, t, _ = x.shape
        attn, (heads, kv_heads, _) = self.self_attn, self.shape
        q, k, v = backend.linears(self.input_layernorm(x), (attn.q_proj, attn.k_proj, attn.v_proj))
        attended = attend(index, self._heads(q, heads, attn.q_norm, cos, sin), self._heads(k, kv_heads, attn.k_norm, cos, sin),
                          self._heads(v, kv_heads, None, None, None))  # [B, Hq, T, D]
        x = x + backend.linear(attended.transpose(1, 2).reshape(b, t, -1), attn.o_proj)
        mlp = self.mlp
        gate, up = backend.linears(self.post_attention_layernorm(x), (mlp.gate_proj, mlp.up_proj))
        return x + backend.linear(F.silu(gate) * up, mlp.down_proj)


class DFlashModel(FeatureDraftModel):
    """``fc`` + ``hidden_norm`` (the context), the draft ``layers``, ``norm`` and the draft ``lm_head``; the
    target's input embeddings are attached (:meth:`attach`), not owned. See the module docstring."""

    what = "block drafter"

    def __init__(self, cfg: DFlashConfig, backend: Backend = Backend()):
        if cfg.block_size < 2:
            raise ValueError(f"a block drafter's block_size must be >= 2 (the anchor and at least one masked "
                             f"position), got {cfg.block_size}")
        super().__init__(cfg.vocab_size, cfg.hidden_size, cfg.draft_vocab_size, cfg.head_dim, cfg.rope_theta)
        self.cfg = cfg
        self.backend = backend
        self.fc = nn.Linear(len(cfg.aux_layers) * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.layers = nn.ModuleList([DFlashLayer(cfg) for _ in range(cfg.num_layers)])
        if cfg.anchor_inputs:  # the token embeddings normed as the context is (see block_inputs)
            self.embed_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        with torch.no_grad():  # transformers' initialisation (std 0.02): the layers' first writes into the stream are
            for layer in self.layers.modules():  # small, so the block's inputs reach the LM head from the first step
                if isinstance(layer, nn.Linear):
                    layer.weight.normal_(0.0, INIT_STD)
        self._plan: tuple | None = None  # see _layer_plan()
        self._block_masks: dict[tuple, torch.Tensor] = {}  # (size, device) -> all-ones [size, size] (see draft_block)

    def block_inputs(self, anchors: torch.Tensor, last: torch.Tensor) -> torch.Tensor:  # [N], [N, H] -> [N, B, H]
        """The blocks' inputs: each anchor's embedding, then B − 1 mask embeddings; with ``anchor_inputs``, plus
        ``last`` (the fused context of the newest committed position, :meth:`context`) at every position and
        the anchor's embedding at the masked ones: what EAGLE's layer reads at its first draft, given to every
        position directly rather than only through attention, which a few draft layers trained on a CPU budget
        learn slowly (the published recipe trains on ~800k samples)."""
        cfg = self.cfg
        tokens = anchors.new_full((anchors.shape[0], cfg.block_size), cfg.mask_token_id)
        tokens[:, 0] = anchors
        x = self._scaled(F.embedding(tokens, self.embed_weight)).to(self.fc.weight.dtype)
        if cfg.anchor_inputs:  # normed first: a target's embeddings are small beside the normed context (RMS 0.14)
            x = self.embed_norm(x)
            anchor = x[:, :1]
            x = torch.cat([anchor, x[:, 1:] + anchor], 1) + last[:, None].to(x.dtype)
        return x

    def context(self, features: torch.Tensor) -> torch.Tensor:  # [B, T, L*Ht] -> [B, T, H]
        """The target's features fused and normed: what every layer's keys and values of the context read."""
        return self.hidden_norm(self.backend.linear(features.to(self.fc.weight.dtype), self.fc))

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor
                   ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:  # [B, T, H], per layer (k, v)
        """The fused context [B, T, H] and each layer's keys and values of it [B, Hkv, T, D]."""
        context = self.context(features)
        cos, sin = self.rope(positions, context.dtype)
        return context, [layer.context_kv(context, cos, sin, self.backend) for layer in self.layers]

    def blocks(self, x: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """The draft layers over block inputs x [N, Q, H] (:meth:`block_inputs`; Q = one block, or several side by
        side in training, which ``attend`` keeps apart) at positions [N, Q] -> hidden states [N, Q, H] (before
        the final norm; :meth:`logits` applies it)."""
        cos, sin = self.rope(positions, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, attend, i, self.backend)
        return x

    # ---- decoding over a cache ----------------------------------------------------------------------

    def new_cache(self, batch_size: int, capacity: int, pad: torch.Tensor) -> KVCache:
        cfg = self.cfg
        return KVCache.allocate(cfg.num_layers, batch_size, cfg.num_kv_heads, capacity, cfg.head_dim, pad,
                                dtype=self.fc.weight.dtype, device=self.fc.weight.device)

    def write_context(self, features: torch.Tensor, cache: KVCache, kv_len: int | None = None,
                      positions: torch.Tensor | None = None) -> torch.Tensor:
        """The context entries of T positions per row [B, T, L*Ht], written (uncommitted) after each row's
        committed ones at their positions (``positions`` [B, T]: those, as the caller has them already); the caller
        commits those that are real. Returns the fused context [B, T, H] (a block's ``last`` input is the newest
        committed position's)."""
        features = features.to(self.fc.weight.dtype)
        kernels = self._fused(features)
        if positions is None:
            positions = fused.new_positions(kernels, cache, None, features.shape[1])
        if kernels is not None:
            return self._fused_context(kernels, features, positions, cache, kv_len)
        context, kv = self.context_kv(features, positions)
        for i, (k, v) in enumerate(kv):
            cache.write(i, k, v, kv_len)
        return context

    def draft_block(self, anchors: torch.Tensor, last: torch.Tensor, cache: KVCache,
                    kv_len: int | None = None) -> torch.Tensor:
        """One block per row after the committed context: anchors [B] (each row's newest token, at the position
        after its context) and ``last`` [B, H] (the fused context of the row's newest committed position) ->
        hidden states [B, block, H]. The block's entries are written uncommitted (forgotten by the next write)."""
        size = self.cfg.block_size
        key = (size, anchors.device)
        if key not in self._block_masks:  # bidirectional in the block
            self._block_masks[key] = torch.ones(size, size, dtype=torch.bool, device=anchors.device)
        everything = self._block_masks[key]
        in_one = getattr(self.backend.fused_kernels(last), "block_inputs", None)  # the Triton kernels': one kernel
        if (in_one is not None and self.cfg.anchor_inputs and self.embed_norm.eps is not None  # where these are ~14
                and self.embed_weight.dtype == self.fc.weight.dtype == self.embed_norm.weight.dtype):
            x = in_one(anchors, last, self.embed_weight, self.embed_scale, size, self.cfg.mask_token_id,
                       self.embed_norm.weight, self.embed_norm.eps)
        else:
            x = self.block_inputs(anchors, last)
        kernels = self._fused(x)
        if kernels is not None:
            return self._fused_blocks(kernels, x, fused.new_positions(kernels, cache, None, size), cache, everything)
        positions = cache.positions(torch.arange(size, device=anchors.device))
        mask = cache.attention_mask(size, kv_len, everything)

        def attend(i, q, k, v):
            keys, values = cache.write(i, k, v, kv_len)
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)

        return self.blocks(x, positions, attend)

    # ---- the same through a fused kernel set (specdec's CPU kernels, or its Triton kernels on a GPU) ---------

    def _fused_context(self, kernels, features: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                       kv_len: int | None) -> torch.Tensor:
        """:meth:`write_context` with the products over the plan's panels (stacked on a GPU) and one kernel per
        RMSNorm (k's per head) and for the keys' rotary embedding (:func:`specdec.models.fused.context_keys_values`):
        the ops of :meth:`context_kv`, sums in another order."""
        b, t, _ = features.shape
        plan = self._plan_for(features)
        rows = features.reshape(b * t, -1).contiguous()
        context = kernels.rms_norm(self.backend.step_product(rows, plan["fc"]), None, *plan["hidden_norm"])
        context = context.view(b, t, -1)
        cos, sin, at = self.rope_at(positions, context.dtype, cache.capacity)  # tables read at `at` on a GPU
        fused.context_keys_values(self.backend, kernels, plan["layers"], fused.Heads(*self.layers[0].shape), context,
                                  cos, sin, cache, kv_len, at)
        return context

    def _fused_blocks(self, kernels, x: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                      everything: torch.Tensor) -> torch.Tensor:
        """The draft layers over one block per row, x [B, S, H] -> [B, S, H], as :meth:`blocks` with the cache's
        attention (every block entry sees the committed context and the whole block), through a fused kernel set
        (:func:`specdec.models.fused.decoder_layers`) and the products over the plan's panels (codes where the
        weights are)."""
        b, s, h = x.shape
        cos, sin, at = self.rope_at(positions, x.dtype, cache.capacity)  # tables read at `at` on a GPU
        layers, heads = self._plan_for(x)["layers"], fused.Heads(*self.layers[0].shape)
        stream, _ = fused.input_stream(self.backend, kernels, layers, x)  # copied for the norms apart
        out = fused.decoder_layers(self.backend, kernels, layers, heads, stream, cos, sin,
                                   fused.Attention(cache, everything, positions=at))
        return out.view(b, s, h)

    def _layer_plan(self, stacked: bool = False) -> dict[str, Any]:
        """What the fused forwards read: each layer as data (:class:`~specdec.models.fused.Layer`, its products
        stacked and packed as :meth:`CompactDecoder._layer_plan`'s; k|v again for the context), then ``fc``, the
        norms and the LM head; rebuilt when a submodule or a parameter it was built from is replaced or updated in
        place, or the backend changes (:class:`ProductPlan`). ``stacked``: the products stacked for a GPU's
        ``F.linear``."""
        if self._plan is not None and self._plan[1].stacked == stacked and self._plan[1].current(self.backend):
            return self._plan[0]
        built = ProductPlan(self.backend, self.fc.weight.dtype, stacked=stacked)
        layers, = built.hold(self, "layers")
        per_layer = []
        for layer in built.hold(layers, *layers._modules):
            attn, mlp = built.hold(layer, "self_attn", "mlp")
            per_layer.append(fused.Layer(
                built.group(attn, "q_proj", "k_proj", "v_proj"), built.group(attn, "o_proj"),
                built.group(mlp, "gate_proj", "up_proj"), built.group(mlp, "down_proj"),
                built.norm(layer, "input_layernorm"), built.norm(layer, "post_attention_layernorm"),
                q_norm=built.norm(attn, "q_norm"), k_norm=built.norm(attn, "k_norm"),
                kv=built.group(attn, "k_proj", "v_proj")))
        plan = {"layers": per_layer, "fc": built.group(self, "fc"), "hidden_norm": built.norm(self, "hidden_norm"),
                "norm": built.norm(self, "norm"), "lm_head": built.group(self, "lm_head")}
        self._plan = (plan, built)
        return plan


# ---- checkpoint format ------------------------------------------------------------------------------------

def dflash_config_json(cfg: DFlashConfig, verifier: str = "") -> dict[str, Any]:
    """``config.json``: a Qwen3 config of the draft layers with ``dflash_config``, as the DFlash reference
    drafters write it, plus ``draft_vocab_size`` and specdec's own facts."""
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "max_position_embeddings": cfg.max_positions, "vocab_size": cfg.vocab_size,
        "attention_bias": False, "tie_word_embeddings": False,
        "target_hidden_size": cfg.target_hidden_size, "draft_vocab_size": cfg.draft_vocab_size,
        "block_size": cfg.block_size,
        "dflash_config": {"target_layer_ids": list(cfg.aux_layers), "block_size": cfg.block_size,
                          "mask_token_id": cfg.mask_token_id, "anchor_inputs": cfg.anchor_inputs},
        "specdec": {"target": cfg.target, "verifier": verifier, **cfg.extra},
    }


def save_dflash(directory: str | Path, model: DFlashModel, *, verifier: str = "", dtype: torch.dtype | None = None,
                extra: dict[str, Any] | None = None) -> None:
    """Write ``model`` as ``config.json`` + ``model.safetensors`` (atomically each); ``dtype`` stores the
    weights in it. ``lm_head`` is the draft vocabulary's and ``d2t`` (+ ``t2d``) maps it to target ids: the
    DFlash reference loaders (SGLang, vLLM, z-lab's) take a drafter without its own LM head that reads the
    target's full one, so they do not load these files as they are (the draft LM head is specdec's, for a
    drafter whose logits over the whole vocabulary would cost more than its layers on a CPU)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_weights(directory, model, dtype)
    cfg = model.cfg
    config = dflash_config_json(cfg, verifier)
    config["specdec"].update(extra or {})
    write_json(directory / "config.json", config)


_HINT = ("point drafter.path at a directory holding config.json + model.safetensors of a block drafter, e.g. one "
         "written by `python -m specdec.train method=dflash`, or use "
         f"drafter.path={DEFAULT_DFLASH} for the default target's")


def _config_from_json(raw: dict[str, Any], path: Path) -> DFlashConfig:
    block = raw.get("dflash_config")
    if not isinstance(block, dict) or "DFlashDraftModel" not in (raw.get("architectures") or []):
        raise CheckpointError(f"{str(path)!r} is not a block (DFlash) drafter config (no DFlashDraftModel "
                              f"architecture with a dflash_config); {_HINT}")
    try:
        heads, hidden = int(raw["num_attention_heads"]), int(raw["hidden_size"])
        extra = dict(raw.get("specdec") or {})
        target = str(extra.pop("target", ""))
        extra.pop("verifier", None)
        rope = raw.get("rope_parameters") or {}
        return DFlashConfig(
            hidden, int(raw["intermediate_size"]), int(raw["num_hidden_layers"]), heads,
            int(raw.get("num_key_value_heads", heads)), int(raw.get("head_dim") or hidden // heads),
            int(raw["vocab_size"]), int(raw.get("draft_vocab_size") or raw["vocab_size"]),
            tuple(int(a) for a in block["target_layer_ids"]), int(raw.get("target_hidden_size") or hidden),
            int(block.get("block_size") or raw.get("block_size") or 16), int(block["mask_token_id"]),
            bool(block.get("anchor_inputs", False)), float(raw.get("rms_norm_eps", 1e-6)), float(rope.get("rope_theta") or raw.get("rope_theta") or 10000.0),
            int(raw.get("max_position_embeddings", 8192)), target, extra)
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{str(path)!r}: a field of the block drafter's config is missing or malformed "
                              f"({err!r}); {_HINT}") from None


def load_dflash(path: str | Path, *, target_config: Any | None = None) -> DFlashModel:
    """A block drafter from a directory, in float32. ``target_config`` (the target's transformers config) is
    checked against: a drafter trained for another target raises :class:`~specdec.errors.CheckpointError`
    naming both."""
    path = Path(path).expanduser()
    directory = path.parent if path.is_file() else path
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"no block drafter at {str(path)!r} (no config.json there); {_HINT}")
    raw = read_json_object(directory / "config.json", what="a drafter config (an object)", hint=_HINT)
    cfg = _config_from_json(raw, directory)
    if target_config is not None:
        check_target(cfg, target_config, directory, what=DFlashModel.what, method="dflash")
    weights = directory / "model.safetensors"
    tensors = read_tensors(weights, what="block drafter weights", hint=_HINT, finite=True)
    model = DFlashModel(cfg)
    if "lm_head.weight" not in tensors:
        raise CheckpointError(f"{str(weights)!r} has no lm_head.weight: a DFlash drafter that reads the target's full "
                              f"LM head, which specdec does not run (its drafts need their own draft-vocabulary "
                              f"head); {_HINT}")
    d2t = draft_to_target(tensors.pop("d2t", None), tensors.pop("t2d", None), cfg, weights, _HINT)
    return load_weights(model, tensors, d2t, weights, "the block drafter its config describes", _HINT)
