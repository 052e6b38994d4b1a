"""Processes and their trees: creating them (``spawn``), finding and killing a whole tree (``tree``),
and the sidecar that kills them when the daemon dies (``reaper``).

Nothing is imported here: the reaper sidecar imports its module alone, with the standard library.
"""
