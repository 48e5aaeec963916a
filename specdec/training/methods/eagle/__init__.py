"""EAGLE-3 as a training method (:mod:`.method`) and its objective (:mod:`.objective`)."""

from specdec.training.methods.eagle.method import EagleMethod, EagleMethodConfig

__all__ = ["EagleMethod", "EagleMethodConfig"]
