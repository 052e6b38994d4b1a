"""Worker process trees: spawning, supervising, killing, and the sidecar that outlives a crash.

Layers, each importing only those below it: ``zygote_program`` (stdlib only, runs in the job's
interpreter), ``proctree`` (processes and their trees), ``cgroups`` (limits and tracking), then
``group`` (one local worker group), then ``warm`` (zygotes and their pool).
"""
