"""An independent small draft model (:class:`DraftModelDrafter`), e.g. the distilled student shipped for
SmolLM2-135M (:mod:`~specdec.drafters.draft_model.student`)."""

from specdec.drafters.draft_model.drafter import DraftModelDrafter

__all__ = ["DraftModelDrafter"]
