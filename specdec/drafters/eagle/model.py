"""The EAGLE-3 draft model (Li et al. 2025) and its checkpoint formats.

One decoder layer over the target's features. At position t its input is the token x_{t+1}'s embedding
(the target's, shared and frozen) beside a hidden state: the target's hidden states at a low, a middle and
a high layer, concatenated and fused by ``fc`` (positions the target has processed), or the draft layer's
own output at t-1 (positions it drafted itself). The two are normed separately and concatenated (2H) into
q/k/v; the residual is the hidden state. Then the usual Llama MLP, a final norm, and an LM head over a
*draft vocabulary* (the Dv tokens most frequent in the training data; ``d2t`` maps them to target ids).

Parameter names are those of the ``speculators`` format that vLLM and SGLang serve
(``../shared/VLLM_INTEROP.md``): a trained drafter is written as ``config.json`` + ``model.safetensors``
(:func:`save_eagle`) and loads there as is; :func:`load_eagle` reads that format and the original EAGLE
repository's (``midlayer.*`` weights, a flat Llama config).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specdec.drafters.features import FeatureDraftModel, check_target, draft_to_target, load_weights, save_weights
from specdec.errors import CheckpointError
from specdec.jobs.io import read_json_object, read_tensors, write_json
from specdec.models import fused
from specdec.models.backend import Backend, ProductPlan, rms_norm_eps
from specdec.models.cache import KVCache
from specdec.models.compact import _rotate_half

DEFAULT_EAGLE = "default"  # the drafter shipped for the default target, SmolLM2-135M-Instruct
SPECULATORS_VERSION = "0.9.0"


def default_eagle_path() -> Path:
    """The EAGLE drafter shipped inside the package for the default target (``drafter.path=default``)."""
    return Path(str(resources.files("specdec") / "assets" / "eagle" / "smollm2-135m"))


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's (and vLLM's) default feature layers for a target of ``num_layers``: low, middle, high."""
    return (2, num_layers // 2, num_layers - 3)


@dataclass
class EagleConfig:
    hidden_size: int  # the draft layer's (= the target's: the embeddings are shared)
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int  # the target's
    draft_vocab_size: int  # rows of the draft LM head
    aux_layers: tuple[int, ...]  # target layers read (ids as CompactDecoder's ``capture``)
    target_hidden_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_positions: int = 8192
    target: str = ""  # what it was trained for (informational)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the target's layer count, for checks

    @classmethod
    def for_target(cls, config: Any, draft_vocab_size: int | None = None,
                   aux_layers: tuple[int, ...] | None = None, target: str = "") -> "EagleConfig":
        """A draft layer shaped like one of ``config``'s (a transformers Llama-family config)."""
        heads = config.num_attention_heads
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
        return cls(config.hidden_size, config.intermediate_size, heads, config.num_key_value_heads,
                   getattr(config, "head_dim", None) or config.hidden_size // heads, config.vocab_size,
                   draft_vocab_size or config.vocab_size,
                   tuple(aux_layers or default_aux_layers(config.num_hidden_layers)), config.hidden_size,
                   float(config.rms_norm_eps), float(theta), int(config.max_position_embeddings), target,
                   {"target_num_layers": int(config.num_hidden_layers)})


class EagleLayer(nn.Module):
    """The draft decoder layer: q/k/v read [norm(embedding); norm(hidden)] (2H), the residual is the hidden."""

    def __init__(self, cfg: EagleConfig):
        super().__init__()
        h = cfg.hidden_size
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(2 * h, cfg.num_heads * cfg.head_dim, bias=False)
        self.self_attn.k_proj = nn.Linear(2 * h, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.self_attn.v_proj = nn.Linear(2 * h, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.self_attn.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, h, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)
        self.input_layernorm = nn.RMSNorm(h, eps=cfg.rms_norm_eps)
        self.hidden_norm = nn.RMSNorm(h, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(h, eps=cfg.rms_norm_eps)
        self.shape = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)

    def project(self, hidden: torch.Tensor, embeds: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                backend: Backend = Backend()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # [B, T, H] x2 -> q [B, Hq, T, D], k, v; the products on ``backend`` (the model's)
        b, t, _ = hidden.shape
        heads, kv_heads, dim = self.shape
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], -1)  # [B, T, 2H]
        attn = self.self_attn
        q, k, v = backend.linears(x, (attn.q_proj, attn.k_proj, attn.v_proj))
        q = q.view(b, t, heads, dim).transpose(1, 2)
        k = k.view(b, t, kv_heads, dim).transpose(1, 2)
        v = v.view(b, t, kv_heads, dim).transpose(1, 2)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    def finish(self, hidden: torch.Tensor, attended: torch.Tensor,  # [B, T, H], [B, Hq, T, D]
               backend: Backend = Backend()) -> torch.Tensor:
        b, _, t, _ = attended.shape
        x = hidden + backend.linear(attended.transpose(1, 2).reshape(b, t, -1), self.self_attn.o_proj)
        h = self.post_attention_layernorm(x)
        mlp = self.mlp
        gate, up = backend.linears(h, (mlp.gate_proj, mlp.up_proj))
        return x + backend.linear(F.silu(gate) * up, mlp.down_proj)


class EagleModel(FeatureDraftModel):
    """``fc`` + one :class:`EagleLayer` + ``norm`` + the draft ``lm_head``; the target's input embeddings
    are attached (:meth:`attach`), not owned. See the module docstring. ``backend``: how its CPU forwards run
    (its drafter's, set by :class:`~specdec.drafters.eagle.drafter.EagleDrafter`)."""

    what = "EAGLE drafter"

    def __init__(self, cfg: EagleConfig, backend: Backend = Backend()):
        super().__init__(cfg.vocab_size, cfg.hidden_size, cfg.draft_vocab_size, cfg.head_dim, cfg.rope_theta)
        self.cfg = cfg
        self.backend = backend
        self.fc = nn.Linear(len(cfg.aux_layers) * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.layers = nn.ModuleList([EagleLayer(cfg)])
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self._plan: tuple | None = None  # see _layer_plan()

    @property
    def layer(self) -> EagleLayer:
        return self.layers[0]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T, H]
        return self._scaled(F.embedding(tokens, self.embed_weight)).to(self.fc.weight.dtype)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:  # [B, T, L*Ht] -> [B, T, H]
        features = features.to(self.fc.weight.dtype)
        if self._fused(features) is not None:
            rows = features.reshape(-1, features.shape[-1]).contiguous()
            return self.backend.step_product(rows, self._plan_for(features)["fc"]).view(*features.shape[:-1], -1)
        return self.backend.linear(features, self.fc)

    def step(self, hidden: torch.Tensor, tokens: torch.Tensor, cache: KVCache, positions: torch.Tensor,
             kv_len: int | None = None, tree: torch.Tensor | None = None, recent: int = 0) -> torch.Tensor:
        """T new entries per row on the draft cache (written uncommitted): hidden [B, T, H] (fused features
        or the layer's own outputs), tokens [B, T], positions [B, T] -> outputs [B, T, H]. Each new entry sees
        its row's committed entries, itself, and what ``tree`` [T, recent + T] allows of the last ``recent``
        committed entries and the new ones (None: the new ones before it; :meth:`KVCache.attention_mask`)."""
        kernels = self._fused(hidden)
        if kernels is not None:
            return self._fused_step(kernels, hidden, tokens, cache, positions, tree, recent)
        cos, sin = self.rope(positions, hidden.dtype, cache.capacity)
        q, k, v = self.layer.project(hidden, self.embed(tokens), cos, sin, self.backend)
        keys, values = cache.write(0, k, v, kv_len)
        mask = cache.attention_mask(tokens.shape[1], keys.shape[2], tree, recent)
        attended = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        return self.layer.finish(hidden, attended, self.backend)

    def step_logits(self, hidden: torch.Tensor, tokens: torch.Tensor, cache: KVCache, positions: torch.Tensor,
                    kv_len: int | None = None, tree: torch.Tensor | None = None, recent: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`step`'s outputs [B, T, H] and :meth:`logits` of them [B, T, Dv], the same values; through the fused
        kernels the layer's last residual add and the final norm run inside the LM head's product (one kernel where
        they were two)."""
        kernels = self._fused(hidden)
        if kernels is not None and type(self).step is EagleModel.step:  # a subclass's own step: called as it is
            return self._fused_step(kernels, hidden, tokens, cache, positions, tree, recent, with_logits=True)
        out = self.step(hidden, tokens, cache, positions, kv_len, tree, recent)
        return out, self.logits(out)

    def _fused_step(self, kernels, hidden: torch.Tensor, tokens: torch.Tensor, cache: KVCache, positions: torch.Tensor,
                    tree: torch.Tensor | None, recent: int, with_logits: bool = False) -> Any:
        """:meth:`step` through a fused kernel set (``kernels``: the CPU's or the Triton kernels;
        :func:`specdec.models.fused.decoder_layers` runs the layer) and the products over the plan's (panels on CPU,
        float16 where the weights are exactly float16; stacked for ``F.linear`` on a GPU): the ops of
        :meth:`EagleLayer.project` and :meth:`EagleLayer.finish`, sums in another order (outputs equal to float32
        rounding, tested)."""
        b, t, h = hidden.shape
        plan = self._plan_for(hidden)
        stream, _ = fused.input_stream(self.backend, kernels, [plan["layer"]], hidden)  # copied for norms apart
        in_one = getattr(kernels, "embedded_norms", None)  # the Triton kernels': one kernel where these are four
        if in_one is not None:
            normed = in_one(tokens.reshape(-1), self.embed_weight, self.embed_scale, stream, *plan["input_norm"],
                            *plan["hidden_norm"])  # [B·T, 2H]
        else:
            embeds = self._scaled(F.embedding(tokens.reshape(-1), self.embed_weight))
            normed = torch.cat([kernels.rms_norm(embeds, None, *plan["input_norm"]),
                                kernels.rms_norm(stream, None, *plan["hidden_norm"])], -1)  # [B·T, 2H]
        cos, sin, at = self.rope_at(positions, hidden.dtype, cache.capacity)  # tables read at `at` on a GPU
        out = fused.decoder_layers(self.backend, kernels, [plan["layer"]], fused.Heads(*self.layer.shape), stream,
                                   cos, sin, fused.Attention(cache, tree, recent, positions=at), normed=normed,
                                   final_norm=plan["norm"] if with_logits else None,
                                   head=plan["lm_head"] if with_logits else None)
        if with_logits:  # (outputs, logits)
            return out[0].view(b, t, h), out[1].view(b, t, -1)
        return out.view(b, t, h)

    def _layer_plan(self, stacked: bool = False) -> dict[str, Any]:
        """What :meth:`_fused_step` and the fused :meth:`logits` read: the layer as data
        (:class:`~specdec.models.fused.Layer`, its products stacked and packed as :meth:`CompactDecoder._layer_plan`'s),
        its two input norms, ``fc``, the final norm and the LM head; rebuilt when a submodule or a parameter it was
        built from is replaced or updated in place, or the backend changes (:class:`ProductPlan`). ``stacked``: the
        products stacked for a GPU's ``F.linear``."""
        if self._plan is not None and self._plan[1].stacked == stacked and self._plan[1].current(self.backend):
            return self._plan[0]
        built = ProductPlan(self.backend, self.fc.weight.dtype, stacked=stacked)
        layers, = built.hold(self, "layers")
        layer, = built.hold(layers, "0")
        attn, mlp = built.hold(layer, "self_attn", "mlp")
        plan = {"layer": fused.Layer(built.group(attn, "q_proj", "k_proj", "v_proj"), built.group(attn, "o_proj"),
                                     built.group(mlp, "gate_proj", "up_proj"), built.group(mlp, "down_proj"), None,
                                     built.norm(layer, "post_attention_layernorm")),
                "input_norm": built.norm(layer, "input_layernorm"), "hidden_norm": built.norm(layer, "hidden_norm"),
                "norm": built.norm(self, "norm"), "lm_head": built.group(self, "lm_head"),
                "fc": built.group(self, "fc")}
        self._plan = (plan, built)
        return plan

    def new_cache(self, batch_size: int, capacity: int, pad: torch.Tensor) -> KVCache:
        cfg = self.cfg
        return KVCache.allocate(1, batch_size, cfg.num_kv_heads, capacity, cfg.head_dim, pad,
                                dtype=self.fc.weight.dtype, device=self.fc.weight.device)


# ---- checkpoint formats ---------------------------------------------------------------------------------

def speculators_config(cfg: EagleConfig, verifier: str = "", speculative_tokens: int = 3) -> dict[str, Any]:
    """``config.json`` of the speculators format (keys vLLM reads; ``norm_before_residual`` written out)."""
    return {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "norm_before_residual": False, "norm_before_fc": False, "fc_norm": False, "norm_output": False,
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layers),
        "transformer_layer_config": {
            "model_type": "llama", "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": 1, "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
            "head_dim": cfg.head_dim, "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
            "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.max_positions,
            "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta}, "rope_theta": cfg.rope_theta,
            "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
        },
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
        },
        "specdec": {"target": cfg.target, **cfg.extra},
    }


def save_eagle(directory: str | Path, model: EagleModel, *, verifier: str = "", dtype: torch.dtype | None = None,
               extra: dict[str, Any] | None = None, speculative_tokens: int = 3) -> None:
    """Write ``model`` in the speculators format: ``config.json`` + ``model.safetensors`` (atomically each).
    ``dtype`` (e.g. torch.float16) stores the weights in it; ``d2t`` (and ``t2d``) only for a draft vocabulary."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_weights(directory, model, dtype)
    cfg = model.cfg
    config = speculators_config(cfg, verifier, speculative_tokens)
    config["specdec"].update(extra or {})
    write_json(directory / "config.json", config)


_HINT = ("point drafter.path at a directory holding config.json + model.safetensors of an EAGLE-3 drafter "
         "(speculators or EAGLE format), e.g. one written by `python -m specdec.train method=eagle`, or use "
         f"drafter.path={DEFAULT_EAGLE} for the default target's")


def _config_from_json(raw: dict[str, Any], path: Path) -> tuple[EagleConfig, str]:
    """(config, weight-name prefix of the draft layer) of a speculators or EAGLE-repository config.json."""
    if raw.get("speculators_model_type") is not None:
        if raw["speculators_model_type"] != "eagle3":
            raise CheckpointError(f"{str(path)!r} holds a {raw['speculators_model_type']!r} speculator; specdec reads "
                                  f"eagle3 only; {_HINT}")
        layer, prefix = raw.get("transformer_layer_config") or {}, "layers.0."
        aux = raw.get("eagle_aux_hidden_state_layer_ids")
        if raw.get("norm_before_residual", True) or raw.get("norm_before_fc") or raw.get("fc_norm"):
            raise CheckpointError(f"{str(path)!r} uses norm_before_residual/norm_before_fc/fc_norm (or leaves "
                                  f"norm_before_residual unset, which means true); specdec implements the plain "
                                  f"EAGLE-3 layer only; {_HINT}")
    elif any("Eagle3" in a for a in raw.get("architectures", [])):
        layer, prefix = raw, "midlayer."
        aux = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or raw.get(
            "eagle_aux_hidden_state_layer_ids")
        if raw.get("norm_before_residual", False):
            raise CheckpointError(f"{str(path)!r} sets norm_before_residual; specdec implements the plain EAGLE-3 "
                                  f"layer only; {_HINT}")
    else:
        raise CheckpointError(f"{str(path)!r} is not an EAGLE-3 drafter config (no speculators_model_type, no "
                              f"Eagle3 architecture); {_HINT}")
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise CheckpointError(f"{str(path)!r} has {layer['num_hidden_layers']} draft layers; specdec runs one; {_HINT}")
    try:
        heads = int(layer["num_attention_heads"])
        hidden = int(layer["hidden_size"])
        rope = layer.get("rope_parameters") or {}
        extra = dict(raw.get("specdec") or {})
        target = str(extra.pop("target", ""))
        cfg = EagleConfig(hidden, int(layer["intermediate_size"]), heads, int(layer.get("num_key_value_heads", heads)),
                          int(layer.get("head_dim") or hidden // heads), int(layer["vocab_size"]),
                          int(raw.get("draft_vocab_size") or layer["vocab_size"]), (),
                          int(raw.get("target_hidden_size") or hidden), float(layer.get("rms_norm_eps", 1e-5)),
                          float(rope.get("rope_theta") or layer.get("rope_theta") or 10000.0),
                          int(layer.get("max_position_embeddings", 8192)), target, extra)
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{str(path)!r}: a field of the draft layer's config is missing or malformed "
                              f"({err!r}); {_HINT}") from None
    cfg.aux_layers = tuple(int(a) for a in aux) if aux else ()
    return cfg, prefix


def load_eagle(path: str | Path, *, target_config: Any | None = None) -> EagleModel:
    """An EAGLE-3 drafter from a directory (speculators or EAGLE-repository format), in float32.

    ``target_config`` (the target's transformers config) fills the feature layers when the file leaves them
    to the default, and is checked against: a drafter trained for another target (hidden size, vocabulary,
    layer count) raises :class:`~specdec.errors.CheckpointError` naming both."""
    path = Path(path).expanduser()
    directory = path.parent if path.is_file() else path
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"no EAGLE drafter at {str(path)!r} (no config.json there); {_HINT}")
    raw = read_json_object(directory / "config.json", what="a drafter config (an object)", hint=_HINT)
    cfg, prefix = _config_from_json(raw, directory)
    if target_config is not None:
        _check_target(cfg, target_config, directory)
    weights = directory / "model.safetensors"
    tensors = read_tensors(weights, what="EAGLE drafter weights", hint=_HINT, finite=True)
    tensors = {("layers.0." + k[len(prefix):] if k.startswith(prefix) else k): v for k, v in tensors.items()}
    model = EagleModel(cfg)
    if "lm_head.weight" not in tensors:
        raise CheckpointError(f"{str(weights)!r} has no lm_head.weight (a drafter sharing the target's LM head); "
                              f"specdec needs the drafter's own; {_HINT}")
    d2t = draft_to_target(tensors.pop("d2t", None), tensors.pop("t2d", None), cfg, weights, _HINT)
    tensors.pop("embed_tokens.weight", None)  # the target's embeddings are used (same hidden size)
    return load_weights(model, tensors, d2t, weights, "an EAGLE-3 layer of its config", _HINT)


def _check_target(cfg: EagleConfig, target_config: Any, directory: Path) -> None:
    if not cfg.aux_layers:
        cfg.aux_layers = default_aux_layers(int(target_config.num_hidden_layers))
    check_target(cfg, target_config, directory, what=EagleModel.what, method="eagle")


@torch.no_grad()
def norm_scale(norm: nn.Module) -> torch.Tensor:
    """The per-channel scale an RMSNorm module applies, whatever its family stores: ``w`` for Llama's, ``1 + w``
    for Gemma's. Read by normalising a vector of ones (RMS 1), whose output is the scale over √(1 + eps)."""
    weight = norm.weight
    ones = torch.ones(1, weight.shape[-1], dtype=weight.dtype, device=weight.device)
    return norm(ones)[0].float() * (1.0 + rms_norm_eps(norm)) ** 0.5
