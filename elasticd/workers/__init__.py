"""Worker process trees: spawning, supervising, killing, and the sidecar that outlives a crash.

Layers, each importing only those below it: ``zygote_program`` and ``snapshot_program`` (what runs
in the job's own interpreter: the zygote's program, the snapshot keeper's and the workers' side of
it), ``proctree`` (processes and their trees), ``cgroups`` (limits and tracking), ``numa_memory``,
then ``group`` (one local worker group), then ``warm`` (zygotes, their pool, the keeper's start).
"""
