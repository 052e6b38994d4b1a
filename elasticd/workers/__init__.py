"""Worker process trees: spawning, supervising, killing, and the sidecar that outlives a crash."""
