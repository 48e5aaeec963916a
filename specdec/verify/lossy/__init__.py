"""Acceptance rules that change the output distribution (``lossy = True``): offered only to measure what
exactness costs, never a default."""
