"""What the daemon and the zygote's program must agree on, written once (standard library only).

The daemon imports this module; the zygote runs this same file first, in the namespace of the
program's other parts (``warm.spawn.BOOT_PARTS``), so its names are globals there.
"""

from __future__ import annotations

SPAWN_FAILED = 127  # the worker never reached exec (or its entry point): like a shell's "command not found"
PARENT_GONE = 70  # the daemon (or the zygote) died between fork and prctl
BOOT_FILE = (
    "<elasticd-zygote>"  # the name every part of the program is compiled under (tracebacks are cut there)
)
PROGRAM_NAME = "__elasticd_zygote__"  # the program's ``__name__`` in the zygote
