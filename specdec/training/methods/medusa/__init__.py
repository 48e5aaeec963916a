"""Medusa heads as a training method (:mod:`.method`) and its objective as pure functions (:mod:`.objective`)."""

from specdec.training.methods.medusa.method import MedusaMethod, MedusaMethodConfig

__all__ = ["MedusaMethod", "MedusaMethodConfig"]
