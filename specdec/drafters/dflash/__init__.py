"""Block drafting (DFlash-style; Chen, Liang, Liu 2026): a few draft layers conditioned on the target's features
draft a block of tokens in one forward.

- :mod:`~specdec.drafters.dflash.model`: the model (``DFlashModel``) and its checkpoint format;
- :mod:`~specdec.drafters.dflash.drafter`: ``DFlashDrafter`` (registered as ``dflash``), chain or tree drafting
  from the block's per-position candidates.

Training: ``python -m specdec.train method=dflash`` (:mod:`specdec.training.methods.dflash`).
"""

from specdec.drafters.dflash.drafter import DFlashDrafter
from specdec.drafters.dflash.model import (DEFAULT_DFLASH, DFlashConfig, DFlashModel, default_dflash_path, load_dflash,
                                           save_dflash)

__all__ = ["DEFAULT_DFLASH", "DFlashConfig", "DFlashDrafter", "DFlashModel", "default_dflash_path", "load_dflash",
           "save_dflash"]
