"""The side-by-side benchmarks (each prompt runs every method in turn, one process)."""
