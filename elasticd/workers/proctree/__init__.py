"""Processes and their trees: creating them (``spawn``), finding and killing a whole tree (``tree``),
the sidecar that kills them when the daemon dies (``reaper``), and the environment marker that
names a worker's daemon and job (``markers``).

Nothing is imported here: the reaper sidecar imports its module alone, with the standard library.
"""
