"""Training methods: one small module per learned drafter, behind :class:`TrainMethod` (see :mod:`.base`).

Importing this package registers every method in :data:`METHODS`.
"""

from specdec.training.methods.base import METHODS, MethodConfig, TrainMethod, build_method, register_method
from specdec.training.methods.dflash import DFlashMethod
from specdec.training.methods.draft_model import DraftModelMethod
from specdec.training.methods.eagle import EagleMethod
from specdec.training.methods.medusa import MedusaMethod

__all__ = ["METHODS", "DFlashMethod", "DraftModelMethod", "EagleMethod", "MedusaMethod", "MethodConfig", "TrainMethod", "build_method",
           "register_method"]
