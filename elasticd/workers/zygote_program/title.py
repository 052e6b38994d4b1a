"""A forked worker's command line and environment block, as ``ps``, ``top`` and ``pgrep -f`` read them.

A forked child keeps its parent's ``/proc/<pid>/cmdline`` and ``/proc/<pid>/environ``: the kernel
reads them from the address ranges the exec recorded (``arg_start..arg_end``, ``env_start..env_end``)
in the process's own memory, so every warm worker would show the zygote's loader and none of its
``RANK``. ``prctl(PR_SET_MM, PR_SET_MM_MAP)`` moves those ranges to a block the child lays out as
exec does (argv strings, then ``KEY=VALUE`` strings, each NUL-terminated, contiguous); the kernel
allows it without privileges (only a new ``exe_fd`` needs one) where it is built with
``CONFIG_CHECKPOINT_RESTORE``, as Debian's, Ubuntu's, RHEL's and Fedora's kernels are. Where the
call fails the worker keeps the zygote's (it runs all the same).

The block is ``malloc``'d and never freed (a few kB per worker): the kernel reads it for as long as
the process lives, and so does every child the worker forks without exec. Standard library only.
"""

from __future__ import annotations

import os

PR_SET_MM = 35
PR_SET_MM_MAP = 14
# prctl_mm_map's fields (include/uapi/linux/prctl.h): eleven u64 addresses, then auxv (a pointer),
# auxv_size and exe_fd (u32 each).
MM_FIELDS = (
    "start_code", "end_code", "start_data", "end_data", "start_brk", "brk", "start_stack",
    "arg_start", "arg_end", "env_start", "env_end",
)  # fmt: skip
# Where each of them is in /proc/self/stat (1-based field numbers, proc(5)); brk is not there.
STAT_FIELDS = {"start_code": 26, "end_code": 27, "start_stack": 28, "start_data": 45, "end_data": 46,
               "start_brk": 47, "arg_start": 48, "arg_end": 49, "env_start": 50, "env_end": 51}  # fmt: skip


# --- pure parts (unit-tested in the daemon's test suite) ---------------------------------------------


def exec_block(argv: list[str], env: dict[str, str]) -> tuple[bytes, int]:
    """What exec lays out: argv then the environment, each string NUL-terminated (encoded as
    ``os.fsencode`` does); and where the environment begins."""
    args = b"".join(os.fsencode(a) + b"\0" for a in argv)
    envs = b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0" for k, v in env.items())
    return args + envs, len(args)


def stat_map(stat: bytes) -> dict[str, int]:
    """The memory map's addresses in one read of ``/proc/self/stat`` (all but ``brk``)."""
    fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm) ": comm may hold anything
    return {name: int(fields[number - 3]) for name, number in STAT_FIELDS.items()}


# --- in the forked child -----------------------------------------------------------------------


def look_like(argv: list[str], env: dict[str, str]) -> bool:
    """Show ``argv`` and ``env`` as this process's command line and environment; False when the
    kernel refused (the zygote's stay)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.malloc.restype = ctypes.c_void_p
        libc.sbrk.restype = ctypes.c_void_p
        block, env_at = exec_block(argv, env)
        addr = libc.malloc(len(block))
        if not addr:
            return False
        ctypes.memmove(addr, block, len(block))
        with open("/proc/self/stat", "rb") as f:
            now = stat_map(f.read())
        spans = {"arg_start": addr, "arg_end": addr + env_at, "env_start": addr + env_at,
                 "env_end": addr + len(block)}  # fmt: skip

        class MmMap(ctypes.Structure):
            _fields_ = [(n, ctypes.c_uint64) for n in MM_FIELDS] + [
                ("auxv", ctypes.c_uint64), ("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)
            ]  # fmt: skip

        mm = MmMap(**(now | spans), auxv=0, auxv_size=0, exe_fd=0xFFFFFFFF)  # exe_fd -1: keep the exe
        ref = ctypes.byref(mm)
        mm.brk = libc.sbrk(0)  # read last: the map sets brk too, and a malloc in between may move it
        return bool(libc.prctl(PR_SET_MM, PR_SET_MM_MAP, ref, ctypes.sizeof(mm), 0) == 0)
    except Exception:  # (no libc, no /proc: the worker runs with the zygote's)
        return False
