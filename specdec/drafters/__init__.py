"""Drafting strategies behind one protocol (:class:`Drafter`), registered by name."""

from specdec.drafters.base import DRAFTERS, DecodeState, Drafter, Proposal, build_drafter, register
from specdec.drafters.draft_model.drafter import DraftModelDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.medusa import MedusaDrafter
from specdec.drafters.ngram import NgramDrafter

__all__ = ["DRAFTERS", "DecodeState", "DraftModelDrafter", "Drafter", "EagleDrafter", "MedusaDrafter", "NgramDrafter", "Proposal",
           "build_drafter", "register"]
