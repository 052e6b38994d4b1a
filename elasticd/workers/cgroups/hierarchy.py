"""Hierarchy discovery: which cgroup hierarchies this process sits in, and the best limit backend.

Above the backends and the types (``fs``, ``limits``, ``backends``), below tracking, which finds
its unified hierarchy with the same parsers.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from elasticd import log
from elasticd.workers.cgroups.backends import CgroupV1Backend, CgroupV2Backend
from elasticd.workers.cgroups.fs import CgroupFs, KernelFs
from elasticd.workers.cgroups.limits import LimitBackend, LimitError, RlimitBackend, check_name

_log = log.get("elasticd.limits")


@dataclass(frozen=True)
class Mount:
    fstype: str  # "cgroup" (v1) or "cgroup2"
    root: str  # the hierarchy path mounted here ("/" unless bind-mounted, e.g. in a container)
    point: Path
    options: frozenset[str]  # super options; for v1 they name the controllers


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        point = Path(_unescape(fields[4]))
        mounts.append(Mount(tail[0], _unescape(fields[3]), point, frozenset(tail[2].split(","))))
    return mounts


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def parse_proc_cgroup(text: str) -> dict[frozenset[str], str]:
    """``4:memory:/a`` → ``{{"memory"}: "/a"}``; the v2 line ``0::/b`` → ``{frozenset(): "/b"}``."""
    memberships = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            memberships[frozenset(c for c in parts[1].split(",") if c)] = parts[2]
    return memberships


def own_dir(
    mounts: list[Mount], memberships: dict[frozenset[str], str], controller: str | None
) -> Path | None:
    """This process's cgroup directory in the v1 hierarchy of ``controller``, or in v2 (None)."""
    if controller is None:
        path, fstype = memberships.get(frozenset()), "cgroup2"
    else:
        path = next((p for key, p in memberships.items() if controller in key), None)
        fstype = "cgroup"
    for mount in mounts:
        if path is None or mount.fstype != fstype or (controller and controller not in mount.options):
            continue
        rel = os.path.relpath(path, mount.root)
        if rel == ".." or rel.startswith("../"):  # not under this mount (another namespace's view)
            continue
        return mount.point if rel == "." else mount.point / rel
    return None


def detect(
    *,
    instance: str = "",
    proc_cgroup: Path = Path("/proc/self/cgroup"),
    mountinfo: Path = Path("/proc/self/mountinfo"),
    fs: CgroupFs | None = None,
    move_self: bool = True,
) -> LimitBackend:
    """The best backend this process may use: cgroup v2, else the v1 memory hierarchy, else rlimits.

    v2 needs memory and cpu offered to the daemon's cgroup and a child we can create there
    (after moving the daemon into a leaf if needed, see ``CgroupV2Backend.prepare``); v1 needs
    the memory hierarchy mounted and a child we can create in it (the cpu hierarchy is used if
    it is writable too, else CPU limits pin cores). Call it early, before the daemon starts any
    child, so that a v2 move leaves nothing behind in the daemon's cgroup. ``instance`` (e.g.
    the node id) adds a level to the paths, so several daemons on one host never share a job's
    directory. Files and the filesystem are injectable for tests; the choice is logged.
    """
    if instance:
        check_name("instance", instance)
    backend, why = _probe(instance, proc_cgroup, mountinfo, fs, move_self)
    chosen: LimitBackend = backend if backend is not None else RlimitBackend()
    _log.info("limits.backend", backend=chosen.name, why=why)
    return chosen


def _probe(
    instance: str, proc_cgroup: Path, mountinfo: Path, fs: CgroupFs | None, move_self: bool
) -> tuple[LimitBackend | None, str]:
    """The first cgroup backend that works here, and why (or why none did)."""
    cgfs = fs if fs is not None else KernelFs()
    try:
        mounts = parse_mountinfo(mountinfo.read_text())
        memberships = parse_proc_cgroup(proc_cgroup.read_text())
    except OSError as exc:
        return None, f"cannot read {exc.filename}: {exc.strerror}"
    reasons = []
    unified = own_dir(mounts, memberships, None)
    if unified is None:
        reasons.append("cgroup2: no unified hierarchy mounted")
    else:
        try:
            v2 = CgroupV2Backend.prepare(unified, instance, cgfs, move_self)
            return v2, f"unified hierarchy at {unified} delegates memory and cpu"
        except LimitError as exc:
            reasons.append(f"cgroup2: {exc.message}")
    memory = own_dir(mounts, memberships, "memory")
    if memory is None:
        reasons.append("cgroup1: no memory hierarchy mounted")
        return None, "; ".join(reasons)
    try:
        memory_base = CgroupV1Backend.prepare_base(memory, instance, cgfs)
    except LimitError as exc:
        reasons.append(f"cgroup1: {exc.message}")
        return None, "; ".join(reasons)
    cpu_base, cpu_note = None, "cpu hierarchy not mounted, CPU limits pin cores"
    cpu = own_dir(mounts, memberships, "cpu")
    if cpu is not None:
        try:
            cpu_base, cpu_note = CgroupV1Backend.prepare_base(cpu, instance, cgfs), f"cpu at {cpu}"
        except LimitError as exc:
            cpu_note = f"{exc.message}, CPU limits pin cores"
    reasons.append(f"cgroup1: memory at {memory}, {cpu_note}")
    return CgroupV1Backend(memory_base, cpu_base, cgfs), "; ".join(reasons)
