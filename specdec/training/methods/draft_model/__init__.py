"""The distilled draft model as a training method (see :mod:`.method`)."""

from specdec.training.methods.draft_model.method import DraftModelMethod, DraftModelMethodConfig

__all__ = ["DraftModelMethod", "DraftModelMethodConfig"]
