"""Contract tests: one suite, run against every implementation of a seam (in memory and real)."""
