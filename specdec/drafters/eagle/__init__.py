"""EAGLE-3 feature drafting (Li et al. 2025), with EAGLE-2's dynamic trees.

- :mod:`~specdec.drafters.eagle.model`: the draft model (``EagleModel``: one decoder layer over the target's
  low/middle/high features) and its checkpoint formats (speculators, as vLLM/SGLang serve it; the EAGLE
  repository's);
- :mod:`~specdec.drafters.eagle.drafter`: ``EagleDrafter`` (registered as ``eagle``), chain or tree drafting.

Training: ``python -m specdec.train method=eagle`` (:mod:`specdec.training.methods.eagle`).
"""

from specdec.drafters.eagle.drafter import EagleDrafter
from specdec.drafters.eagle.model import (DEFAULT_EAGLE, EagleConfig, EagleModel, default_aux_layers, default_eagle_path,
                                          load_eagle, save_eagle)

__all__ = ["DEFAULT_EAGLE", "EagleConfig", "EagleDrafter", "EagleModel", "default_aux_layers", "default_eagle_path",
           "load_eagle", "save_eagle"]
