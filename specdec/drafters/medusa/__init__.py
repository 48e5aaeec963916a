"""Medusa heads (Cai et al. 2024): draft heads on the target's last hidden state, no draft model.

- :mod:`~specdec.drafters.medusa.heads`: the heads (``MedusaHeads``) and their file format;
- :mod:`~specdec.drafters.medusa.candidates`: how the heads are called to draft (independent or
  token-aware heads);
- :mod:`~specdec.drafters.medusa.drafter`: ``MedusaDrafter`` (registered as ``medusa``), chain or tree
  drafting; the trees themselves (plans, dynamic pruning, the lookup branch) are
  :mod:`specdec.drafters.trees`, shared with other tree drafters.
"""

from specdec.drafters.medusa.drafter import MedusaDrafter, drafting_dtype, fast_bf16
from specdec.drafters.medusa.heads import FORMAT, MedusaHeads, ResBlock, default_heads_path, load_heads, save_heads
from specdec.drafters.trees.plan import check_paths

__all__ = ["FORMAT", "MedusaDrafter", "MedusaHeads", "ResBlock", "check_paths", "default_heads_path",
           "drafting_dtype", "fast_bf16", "load_heads", "save_heads"]
