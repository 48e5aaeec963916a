"""An independent small draft model (:class:`DraftModelDrafter`), e.g. the distilled student shipped for
SmolLM2-135M (:mod:`~specdec.drafters.draft_model.student`), or any causal LM with another tokenizer than the
target's (:class:`CrossVocabDrafter`, :mod:`~specdec.drafters.draft_model.cross_vocab`)."""

from specdec.drafters.draft_model.cross_vocab import CrossVocabDrafter
from specdec.drafters.draft_model.drafter import DraftModelDrafter

__all__ = ["CrossVocabDrafter", "DraftModelDrafter"]
