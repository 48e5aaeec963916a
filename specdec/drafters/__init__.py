"""Drafting strategies behind one protocol (:class:`Drafter`), registered by name."""

from specdec.drafters.base import DRAFTERS, DecodeState, Drafter, Proposal, register
from specdec.drafters.dflash import DFlashDrafter
from specdec.drafters.draft_model.drafter import DraftModelDrafter
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.loading import build_drafter, drafter_config, load_drafter
from specdec.drafters.medusa import MedusaDrafter
from specdec.drafters.ngram import NgramDrafter

__all__ = ["DRAFTERS", "DFlashDrafter", "DecodeState", "DraftModelDrafter", "Drafter", "EagleDrafter", "MedusaDrafter", "NgramDrafter", "Proposal",
           "build_drafter", "drafter_config", "load_drafter", "register"]
