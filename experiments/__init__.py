"""Studies beside the package (benchmarks, cost curves, probes): not shipped, not tests; see README.md here."""
