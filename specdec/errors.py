"""specdec's own exceptions (no heavy imports: drafters, jobs and tests import them freely)."""

from __future__ import annotations


class ModelLoadError(OSError):
    """A model could not be loaded: the hub is unreachable, the repo does not exist, or a package is missing."""


class VocabMismatchError(ValueError):
    """Draft and target do not share a vocabulary, so draft tokens cannot be verified by the target."""


class CheckpointError(ValueError):
    """A file a user pointed at (drafter weights, a training checkpoint or data cache) is not one specdec
    wrote, is truncated or corrupt, or was written for another model."""
