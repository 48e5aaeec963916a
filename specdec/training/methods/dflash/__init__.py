"""The block drafter (DFlash-style) as a training method (:mod:`.method`) and its objective (:mod:`.objective`)."""

from specdec.training.methods.dflash.method import DFlashMethod, DFlashMethodConfig

__all__ = ["DFlashMethod", "DFlashMethodConfig"]
