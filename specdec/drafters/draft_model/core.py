"""What the draft-model drafters share: a causal LM drafting on its own static cache (:class:`ModelDrafter`), the
same-tokenizer one (:mod:`~specdec.drafters.draft_model.drafter`) and the cross-vocabulary one
(:mod:`~specdec.drafters.draft_model.cross_vocab`): its decoder (the first N layers of a model), the draft length's
settings (a confidence floor, a schedule moved by acceptance), a restricted LM head, and graphs of its forwards."""

from __future__ import annotations

import torch

from specdec.drafters.base import DecodeState, Drafter, DraftRuntime
from specdec.models import CompactDecoder, GraphedDecoder, as_decoder
from specdec.models.backend import Backend
from specdec.models.graphs import Graphs


class ModelDrafter(Drafter):
    """``model`` (a transformers causal LM or a decoder, its first ``num_layers`` layers) drafting on its own cache,
    ``confidence`` and ``schedule`` setting the draft length, ``vocab_ids`` its LM head's rows (None: all), its CPU
    forwards on ``backend``. A subclass proposes (and is built from a config)."""

    SCHEDULES = ("constant", "heuristic")

    def __init__(self, model: torch.nn.Module, num_layers: int | None = None, *, confidence: float = 0.0,
                 schedule: str = "constant", vocab_ids: torch.Tensor | None = None, backend: Backend = Backend()):
        if not 0.0 <= confidence < 1.0:
            raise ValueError(f"drafter.confidence must be in [0, 1) (0 = off), got {confidence}")
        if schedule not in self.SCHEDULES:
            raise ValueError(f"drafter.schedule must be one of {list(self.SCHEDULES)}, got {schedule!r}")
        self.backend = backend
        self.decoder = as_decoder(model, num_layers=num_layers, backend=backend)
        self.confidence, self.schedule = confidence, schedule
        self.vocab_ids = None
        if vocab_ids is not None:
            self._restrict_head(vocab_ids)
        self.cache = None
        self.runtime = DraftRuntime(backend, device=self._graph_device, route=self._use_graphs)
        self.length = None  # the heuristic schedule's current draft length (None: start at k)
        self.proposed = 0  # drafts in the last proposal

    def _restrict_head(self, vocab_ids: torch.Tensor) -> None:
        """Score only ``vocab_ids``: this drafter's decoder gets its own LM head over those rows (the model's,
        shared with the target for an early-exit or stitched student, is left alone)."""
        head = getattr(self.decoder, "lm_head", None)
        if not isinstance(head, torch.nn.Linear):
            raise ValueError("drafter.draft_vocab needs the compact path (an LM head to cut; families: llama, "
                             "mistral, qwen2, qwen3, gemma3)")
        ids = vocab_ids.to(device=head.weight.device, dtype=torch.long)
        small = torch.nn.Linear(head.in_features, ids.numel(), bias=False, device=head.weight.device,
                                dtype=head.weight.dtype)
        small.weight.data.copy_(head.weight.data[ids])
        small.weight.requires_grad_(False)
        self.decoder.lm_head = small
        self.vocab_ids = ids

    def _graph_device(self) -> torch.device | None:
        """The draft's decode forwards replay graphs as the target's do, on the compact path only: a step's whole
        chain as one graph (a same-tokenizer draft of a fixed length), else a [B, 2] and a [B, 1] forward, each
        captured once per batch size (a few-layer draft's eager step is all kernel launches: a K-token draft would
        cost more than the graphed verify)."""
        return self.decoder.device if isinstance(self.decoder, CompactDecoder) else None

    def _use_graphs(self, graphs: Graphs, compile: bool) -> None:
        """The draft's decoder wrapped to replay ``graphs`` (compiled first for ``compile``)."""
        self.decoder = GraphedDecoder(self.decoder, compile=compile, graphs=graphs)

    def observe(self, state: DecodeState) -> None:
        """The heuristic schedule's next length: +2 after a step that kept every draft of each active row, else -1."""
        if self.schedule != "heuristic" or state.num_accepted is None:
            return
        kept_all = all(n >= self.proposed for n, a in zip(state.num_accepted.tolist(), state.active) if a)
        self.length = self.length + 2 if kept_all else max(1, self.length - 1)
