"""The zygote's own program: it runs in the *job's* interpreter, as the submitter, never in the daemon.

Standard library only. The daemon reads these files' source (``warm.spawn.BOOT_PARTS``) and hands
it over a pipe; they run, in order, in one namespace. ``shared`` is the first part, and the daemon
imports the same file: the constants both sides must agree on are written once.
"""
