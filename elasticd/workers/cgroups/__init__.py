"""cgroups and their fallback: per-worker limits and the tracking cgroups every job's processes join.

One direction of imports, bottom to top: ``fs`` (the filesystem seam and the layout's names) and
``limits`` (the limit types and the rlimit fallback), ``backends`` (cgroup v2 and v1), ``hierarchy``
(which hierarchies this process sits in, and the backend to use), ``kill`` (kill and remove a
cgroup tree), ``tracking`` (a job's processes, findable and killable as one).
"""
