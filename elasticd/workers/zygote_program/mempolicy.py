"""A worker's memory policy under ``--numa-binding``: ``set_mempolicy(2)`` through ctypes (standard
library only: the zygote runs it in the job's interpreter, and the daemon imports the same file).

A rank bound to CPUs also prefers the NUMA nodes of those CPUs for its memory. The policy belongs
to the thread that sets it and is inherited by the threads and processes it starts, and it
survives exec: an exec'd worker's pre-exec step sets it (``workers.group.before_drop``), a forked
worker sets it itself once it has its go (``child.become_worker``), before any of its code runs.

*Preferred*, not bound: torchrun binds CPUs only (torch's ``numa.binding`` runs ``numactl
--physcpubind``, or ``sched_setaffinity``) and leaves pages where they are first touched. A strict
bind (``MPOL_BIND``, ``numactl --membind``) would add a failure torchrun does not have: a rank
whose node is full would be reclaimed or OOM-killed while other nodes have memory free, page cache
included. ``MPOL_PREFERRED`` (one node) or ``MPOL_PREFERRED_MANY`` (several, Linux 5.15+) puts
pages on the rank's nodes and falls back elsewhere when they are full; it holds when the worker,
or a library in it, later widens its CPU affinity.

glibc has no ``set_mempolicy`` (libnuma has), so the call goes through ``syscall(2)`` by number.
Where the kernel refuses (ENOSYS: another architecture; EPERM: a seccomp profile; EINVAL: a node
without memory, or several nodes before 5.15) the worker goes on with the default policy: the
daemon tries the same call once itself and logs the refusal (``workers.numa_memory``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (annotations only: the job's python may be older than the daemon's)
    from collections.abc import Callable, Iterable

MPOL_DEFAULT = 0
MPOL_PREFERRED = 1
MPOL_BIND = 2
MPOL_PREFERRED_MANY = 5
MAX_NODE = 4096  # node numbers 0..MAX_NODE-1 (the kernel's own limit, MAX_NUMNODES, is at most 1024)
# (set_mempolicy, get_mempolicy) by ``uname -m``: x86_64's table, and the generic one of arm64.
MEMPOLICY_SYSCALLS = {"x86_64": (238, 239), "aarch64": (237, 236)}
_ENOSYS = 38
_EINVAL = 22


# --- pure parts (unit-tested in the daemon's test suite) ---------------------------------------------


def node_mask(nodes: Iterable[int], word_bits: int) -> tuple[tuple[int, ...], int]:
    """The words (``unsigned long``, ``word_bits`` each) of a nodemask holding ``nodes``, and the
    ``maxnode`` to pass with it: the kernel reads one bit fewer than ``maxnode`` says."""
    wanted = set(nodes)
    if not wanted or not all(type(n) is int and 0 <= n < MAX_NODE for n in wanted):
        raise ValueError(f"not NUMA nodes: {sorted(map(str, wanted))[:8]!r}")
    words = [0] * (max(wanted) // word_bits + 1)
    for node in wanted:
        words[node // word_bits] |= 1 << (node % word_bits)
    return tuple(words), len(words) * word_bits + 1


def mask_nodes(words: Iterable[int], word_bits: int) -> frozenset[int]:
    """The nodes a nodemask holds (what ``get_mempolicy`` wrote)."""
    return frozenset(i * word_bits + b for i, w in enumerate(words) for b in range(word_bits) if w >> b & 1)


def preferred_mode(nodes: Iterable[int]) -> int:
    """One node: ``MPOL_PREFERRED``; several (a socket's): ``MPOL_PREFERRED_MANY``."""
    return MPOL_PREFERRED if len(set(nodes)) == 1 else MPOL_PREFERRED_MANY


# --- the calls -------------------------------------------------------------------------------------


def prefer_nodes(nodes: Iterable[int]) -> Callable[[], int]:
    """A call that makes the calling thread prefer ``nodes`` for its memory; it returns 0, or the
    errno of the refusal. Everything is resolved here, before any fork: the call itself only makes
    the system call (safe between fork and exec). Raises ``ValueError`` for bad node numbers."""
    import ctypes

    bits = ctypes.sizeof(ctypes.c_ulong) * 8
    wanted = frozenset(nodes)
    words, maxnode = node_mask(wanted, bits)
    numbers = MEMPOLICY_SYSCALLS.get(os.uname().machine)
    if numbers is None:
        return lambda: _ENOSYS
    mask = (ctypes.c_ulong * len(words))(*words)
    args = (ctypes.c_long(numbers[0]), ctypes.c_long(preferred_mode(wanted)))
    size = ctypes.c_ulong(maxnode)
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    syscall.restype = ctypes.c_long

    def call() -> int:
        if syscall(args[0], args[1], mask, size) == 0:
            return 0
        return ctypes.get_errno() or _EINVAL

    return call


def current_policy() -> tuple[int, frozenset[int]]:
    """The calling thread's policy: its mode and nodes (``get_mempolicy(2)``). Raises ``OSError``."""
    import ctypes

    numbers = MEMPOLICY_SYSCALLS.get(os.uname().machine)
    if numbers is None:
        raise OSError(_ENOSYS, os.strerror(_ENOSYS))
    bits = ctypes.sizeof(ctypes.c_ulong) * 8
    words = (ctypes.c_ulong * (MAX_NODE // bits))()
    mode = ctypes.c_int(-1)
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    syscall.restype = ctypes.c_long
    size, flags = ctypes.c_ulong(MAX_NODE), ctypes.c_ulong(0)
    if syscall(ctypes.c_long(numbers[1]), ctypes.byref(mode), words, size, None, flags) != 0:
        errno = ctypes.get_errno() or _EINVAL
        raise OSError(errno, os.strerror(errno))
    return mode.value, mask_nodes(list(words), bits)
