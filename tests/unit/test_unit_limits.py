"""elasticd.workers.cgroups: sizes, backends against a fake cgroupfs, detection, preexec."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from elasticd.workers.cgroups import limits
from elasticd.workers.cgroups.backends import CFS_PERIOD_US, CgroupPlacement, CgroupV1Backend, CgroupV2Backend
from elasticd.workers.cgroups.fs import V1_JOBS, V2_DAEMON, V2_JOBS, KernelFs
from elasticd.workers.cgroups.hierarchy import detect, own_dir, parse_mountinfo, parse_proc_cgroup
from elasticd.workers.cgroups.limits import (
    LimitBackend,
    LimitError,
    ResourceLimits,
    RlimitBackend,
    parse_size,
    pick_cores,
)

MiB = 1 << 20
V2_FILES = {"cgroup.controllers": "cpu io memory", "cgroup.subtree_control": "", "memory.max": "max"}
V2_FILES |= {"memory.swap.max": "max", "memory.oom.group": "0", "cpu.max": "max 100000"}
V2_FILES |= {"memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n"}
V1_MEMORY_FILES = {"memory.limit_in_bytes": "9223372036854771712", "memory.memsw.limit_in_bytes": "x"}
V1_MEMORY_FILES |= {"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n"}
V1_CPU_FILES = {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "-1"}


class FakeKernel(KernelFs):
    """Plain directories standing in for cgroupfs, with the kernel's rules the backends rely on.

    mkdir creates the control files; writing a file the kernel would not have fails; rmdir
    fails with EBUSY while processes or child cgroups remain; a pid written to one cgroup.procs
    leaves every other; enabling controllers in a non-root cgroup that holds processes is EBUSY.
    """

    def __init__(self, root: Path, files: dict[str, str], deny: tuple[str, ...] = ()) -> None:
        self.root = root
        self.files = files
        self.deny = deny  # path fragments where mkdir is not permitted

    def mkdir(self, path: Path) -> None:
        if any(part in str(path) for part in self.deny):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        super().mkdir(path)
        for name, text in {**self.files, "cgroup.procs": ""}.items():
            (path / name).write_text(text)

    def rmdir(self, path: Path) -> None:
        if not path.is_dir():
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        if procs(path) or any(p.is_dir() for p in path.iterdir()):
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))
        for f in path.iterdir():
            f.unlink()
        os.rmdir(path)

    def write(self, path: Path, text: str) -> None:
        if not path.is_file():
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        if path.name == "cgroup.subtree_control" and path.parent != self.root and procs(path.parent):
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))
        if path.name == "cgroup.procs":
            for other in self.root.rglob("cgroup.procs"):
                other.write_text("".join(f"{p}\n" for p in procs(other.parent) if p != text))
            path.write_text("".join(f"{p}\n" for p in [*procs(path.parent), text]))
        else:
            path.write_text(text)


def procs(cgroup: Path) -> list[str]:
    return (cgroup / "cgroup.procs").read_text().split()


def make_cgroup(fs: FakeKernel, path: Path, **files: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fs.mkdir(path)
    for name, text in files.items():
        (path / name.replace("_", ".")).write_text(text)
    return path


# --- parse_size and ResourceLimits --------------------------------------------------------


SIZES = {"1073741824": 1 << 30, "512M": 512 * MiB, "64m": 64 * MiB, "8G": 8 << 30, "8g": 8 << 30}
SIZES |= {"1.5GiB": 3 << 29, "1.5 GiB": 3 << 29, "2KB": 2048, "2kib": 2048, "1T": 1 << 40}
SIZES |= {"100B": 100, " 16M ": 16 * MiB, ".5K": 512, "0.1K": 102}  # fractions round down
NOT_SIZES = ["", " ", "M", "GiB", "iB", "5iB", "-1G", "1e9", "12X", "1.2.3M", "0", "0M", "1.5"]
NOT_SIZES += ["nan", "inf", "5 G B", "1P", "1,5G", "0x10"]


@pytest.mark.parametrize(("text", "size"), SIZES.items())
def test_parse_size_accepts(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", NOT_SIZES)
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_resource_limits() -> None:
    assert ResourceLimits().empty
    lim = ResourceLimits.from_spec(64 * MiB, 1.5, 256)
    assert (lim.memory_bytes, lim.cpus, lim.nofile, lim.empty) == (64 * MiB, 1.5, 256, False)
    assert not ResourceLimits(nofile=10).empty
    for bad in ({"memory_bytes": 0}, {"cpus": 0.0}, {"cpus": float("nan")}, {"nofile": -1}):
        with pytest.raises(ValueError):
            ResourceLimits(**bad)


def test_pick_cores_spreads_ranks_and_rounds_up() -> None:
    assert pick_cores(1.0, 0, [0, 1, 2, 3]) == {0}
    assert pick_cores(1.5, 0, [0, 1, 2, 3]) == {0, 1}
    assert pick_cores(1.5, 1, [0, 1, 2, 3]) == {2, 3}
    assert pick_cores(2, 3, [4, 5, 6]) == {4, 5}  # wraps around the available cores
    assert pick_cores(0.01, 5, [7]) == {7}
    assert pick_cores(64, 0, [0, 1]) == {0, 1}


@pytest.mark.parametrize("job", ["", "..", ".hidden", "a/b", "x" * 201, "_probe-1", "a\nb"])
def test_bad_job_ids_never_become_paths(job: str) -> None:
    with pytest.raises(LimitError):
        RlimitBackend().place(job, 0, ResourceLimits(nofile=64))


# --- cgroup v2 against a fake tree ---------------------------------------------------------


@pytest.fixture
def v2(tmp_path: Path) -> tuple[FakeKernel, Path]:
    fs = FakeKernel(tmp_path / "unified", V2_FILES)
    own = make_cgroup(fs, tmp_path / "unified" / "svc")
    return fs, own


def test_v2_moves_the_daemon_out_of_its_cgroup_to_delegate(v2: tuple[FakeKernel, Path]) -> None:
    fs, own = v2
    (own / "cgroup.procs").write_text(f"{os.getpid()}\n")
    backend = CgroupV2Backend.prepare(own, "node-a", fs)
    assert procs(own) == []
    assert procs(own / V2_DAEMON) == [str(os.getpid())]
    assert (own / "cgroup.subtree_control").read_text() == "+memory +cpu"
    assert (own / V2_JOBS / "cgroup.subtree_control").read_text() == "+memory +cpu"
    assert backend.base == own / V2_JOBS / "node-a"
    assert [p.name for p in backend.base.iterdir() if p.is_dir()] == []  # the probe is gone
    # A restart in place (already in elasticd.daemon) delegates from the same cgroup.
    assert CgroupV2Backend.prepare(own / V2_DAEMON, "node-a", fs).base == backend.base


def test_v2_gives_up_when_others_share_the_cgroup_or_controllers_lack(v2: tuple[FakeKernel, Path]) -> None:
    fs, own = v2
    (own / "cgroup.procs").write_text(f"{os.getpid()}\n1\n")
    with pytest.raises(LimitError, match="cannot delegate"):
        CgroupV2Backend.prepare(own, "", fs)
    assert sorted(procs(own)) == sorted([str(os.getpid()), "1"])
    assert not (own / V2_DAEMON).exists()
    with pytest.raises(LimitError):
        CgroupV2Backend.prepare(own, "", fs, move_self=False)
    (own / "cgroup.controllers").write_text("hugetlb io")
    with pytest.raises(LimitError, match="does not offer memory and cpu"):
        CgroupV2Backend.prepare(own, "", fs)


def test_v2_place_writes_limits_and_close_removes(v2: tuple[FakeKernel, Path]) -> None:
    fs, own = v2
    backend = CgroupV2Backend.prepare(own, "", fs)
    p0 = backend.place("job-1", 0, ResourceLimits(64 * MiB, 1.5, 128))
    p1 = backend.place("job-1", 1, ResourceLimits(32 * MiB, 0.001))
    leaf = own / V2_JOBS / "job-1" / "rank_0"
    assert p0.cgroups == (leaf,)
    assert (leaf / "memory.max").read_text() == str(64 * MiB)
    assert (leaf / "memory.swap.max").read_text() == "0"
    assert (leaf / "memory.oom.group").read_text() == "1"
    assert (leaf / "cpu.max").read_text() == f"150000 {CFS_PERIOD_US}"
    assert (leaf.parent / "rank_1" / "cpu.max").read_text() == "1000 100000"  # the kernel's minimum
    assert (leaf.parent / "cgroup.subtree_control").read_text() == "+memory +cpu"
    assert isinstance(p0, CgroupPlacement) and p0.setup.nofile == 128 and len(p0.setup.procs_fds) == 1
    assert not p0.oom_killed()
    (leaf / "memory.events").write_text("oom 1\noom_kill 1\noom_group_kill 1\n")
    assert p0.oom_killed()
    p0.close()
    p0.close()
    assert not leaf.exists() and leaf.parent.exists()  # rank_1 still there
    assert p0.oom_killed()  # remembered from before the leaf went away
    p1.close()
    assert not leaf.parent.exists() and backend.base.exists()


def test_v2_without_swap_or_oom_group_files(tmp_path: Path) -> None:
    files = {k: v for k, v in V2_FILES.items() if k not in ("memory.swap.max", "memory.oom.group")}
    fs = FakeKernel(tmp_path, files)
    backend = CgroupV2Backend.prepare(make_cgroup(fs, tmp_path / "svc"), "", fs)
    backend.place("j", 0, ResourceLimits(memory_bytes=32 * MiB)).close()


def test_v2_only_nofile_needs_no_cgroup(v2: tuple[FakeKernel, Path]) -> None:
    fs, own = v2
    p = CgroupV2Backend.prepare(own, "", fs).place("job-1", 0, ResourceLimits(nofile=99))
    assert p.cgroups == () and not p.oom_killed()
    assert not (own / V2_JOBS / "job-1").exists()
    p.close()


def test_stale_leaf_is_reset_unless_busy(v2: tuple[FakeKernel, Path]) -> None:
    fs, own = v2
    backend = CgroupV2Backend.prepare(own, "", fs)
    leaf = own / V2_JOBS / "job-1" / "rank_0"
    make_cgroup(fs, leaf.parent)
    make_cgroup(fs, leaf, memory_events="oom_kill 3\n")
    p = backend.place("job-1", 0, ResourceLimits(memory_bytes=32 * MiB))
    assert not p.oom_killed()  # a fresh leaf: the predecessor's counter is gone
    p.close()
    make_cgroup(fs, leaf.parent)
    make_cgroup(fs, leaf)
    (leaf / "cgroup.procs").write_text("4242\n")
    with pytest.raises(LimitError, match="still in use"):
        backend.place("job-1", 0, ResourceLimits(memory_bytes=32 * MiB))
    assert procs(leaf) == ["4242"]


def test_close_leaves_a_busy_leaf_for_the_sweep(v2: tuple[FakeKernel, Path]) -> None:
    fs, own = v2
    backend = CgroupV2Backend.prepare(own, "", fs)
    p = backend.place("job-1", 0, ResourceLimits(memory_bytes=32 * MiB))
    (p.cgroups[0] / "cgroup.procs").write_text("4242\n")
    p.close()  # logs, does not raise
    assert p.cgroups[0].exists()
    assert backend.sweep(()) == ()
    (p.cgroups[0] / "cgroup.procs").write_text("")
    assert backend.sweep(()) == (own / V2_JOBS / "job-1",)
    assert not (own / V2_JOBS / "job-1").exists()


def test_sweep_keeps_live_jobs(v2: tuple[FakeKernel, Path]) -> None:
    fs, own = v2
    backend = CgroupV2Backend.prepare(own, "", fs)
    live = backend.place("live-1", 0, ResourceLimits(cpus=1))
    for job in ("dead-1", "dead-2"):
        backend.place(job, 0, ResourceLimits(cpus=1))
    assert sorted(p.name for p in backend.sweep({"live-1"})) == ["dead-1", "dead-2"]
    assert live.cgroups[0].exists()
    live.close()


def test_failed_place_cleans_up(v2: tuple[FakeKernel, Path]) -> None:
    fs, own = v2
    backend = CgroupV2Backend.prepare(own, "", fs)
    (own / V2_JOBS / "job-1").mkdir()  # a job dir without control files: writes fail
    with pytest.raises(LimitError):
        backend.place("job-1", 0, ResourceLimits(memory_bytes=32 * MiB))
    assert [p for p in (own / V2_JOBS / "job-1").iterdir() if p.is_dir()] == []


# --- cgroup v1 against a fake tree ---------------------------------------------------------


def v1_backend(tmp_path: Path, *, cpu: bool = True, memsw: bool = True) -> CgroupV1Backend:
    files = V1_MEMORY_FILES if memsw else {"memory.limit_in_bytes": "1", "memory.oom_control": "oom_kill 0"}
    mem = FakeKernel(tmp_path / "memory", {**files, **V1_CPU_FILES})
    mem_own = make_cgroup(mem, tmp_path / "memory" / "pa" / "x")
    cpu_base = CgroupV1Backend.prepare_base(make_cgroup(mem, tmp_path / "cpu"), "n1", mem) if cpu else None
    return CgroupV1Backend(CgroupV1Backend.prepare_base(mem_own, "n1", mem), cpu_base, mem)


def test_v1_place_writes_both_hierarchies(tmp_path: Path) -> None:
    backend = v1_backend(tmp_path)
    p = backend.place("job-1", 2, ResourceLimits(64 * MiB, 0.5, 300))
    mem_leaf = tmp_path / "memory" / "pa" / "x" / V1_JOBS / "n1" / "job-1" / "rank_2"
    cpu_leaf = tmp_path / "cpu" / V1_JOBS / "n1" / "job-1" / "rank_2"
    assert p.cgroups == (mem_leaf, cpu_leaf)
    assert (mem_leaf / "memory.limit_in_bytes").read_text() == str(64 * MiB)
    assert (mem_leaf / "memory.memsw.limit_in_bytes").read_text() == str(64 * MiB)
    assert (cpu_leaf / "cpu.cfs_period_us").read_text() == "100000"
    assert (cpu_leaf / "cpu.cfs_quota_us").read_text() == "50000"
    assert isinstance(p, CgroupPlacement) and len(p.setup.procs_fds) == 2 and p.setup.cores is None
    assert not p.oom_killed()
    (mem_leaf / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert p.oom_killed()
    p.close()
    assert not mem_leaf.parent.exists() and not cpu_leaf.parent.exists()
    assert backend.sweep(()) == ()


def test_v1_without_memsw_or_cpu_hierarchy_pins_cores_and_skips_unneeded_leaves(tmp_path: Path) -> None:
    backend = v1_backend(tmp_path, cpu=False, memsw=False)
    p = backend.place("job-1", 0, ResourceLimits(64 * MiB, 1.0))
    assert isinstance(p, CgroupPlacement) and p.setup.cores is not None and len(p.setup.cores) == 1
    assert len(p.cgroups) == 1
    cpu_only = backend.place("job-2", 0, ResourceLimits(cpus=1.0))
    assert cpu_only.cgroups == () and not cpu_only.oom_killed()
    p.close()
    cpu_only.close()
    memory_only = v1_backend(tmp_path / "2").place("job-1", 0, ResourceLimits(memory_bytes=64 * MiB))
    assert [c.parts[len(tmp_path.parts) + 1] for c in memory_only.cgroups] == ["memory"]
    memory_only.close()


# --- the child side ------------------------------------------------------------------------

CHILD = (
    "import os, resource;"
    "print(resource.getrlimit(resource.RLIMIT_NOFILE), resource.getrlimit(resource.RLIMIT_AS),"
    " sorted(os.sched_getaffinity(0)))"
)


def run_child(placement: limits.Placement) -> str:
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        preexec_fn=placement.preexec,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_rlimit_backend_preexec_in_a_real_child() -> None:
    cores = sorted(os.sched_getaffinity(0))
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = min(200, hard)  # within the hard limit: no privilege needed
    p = RlimitBackend().place("job-1", 1, ResourceLimits(8 << 30, 1.0, nofile))
    assert p.cgroups == () and not p.oom_killed()
    expected_core = cores[1 % len(cores)]
    assert run_child(p) == f"({nofile}, {nofile}) ({8 << 30}, {8 << 30}) [{expected_core}]"
    p.close()


def test_cgroup_preexec_joins_through_the_parents_fd(tmp_path: Path) -> None:
    """The child writes "0" to the cgroup.procs the parent opened (here a plain file)."""
    backend = v1_backend(tmp_path)
    p = backend.place("job-1", 0, ResourceLimits(64 * MiB, 0.5, 100))
    assert run_child(p).startswith("(100, 100)")
    assert [(leaf / "cgroup.procs").read_text() for leaf in p.cgroups] == ["0", "0"]
    for leaf in p.cgroups:
        (leaf / "cgroup.procs").write_text("")  # the child exited
    p.close()
    assert backend.sweep(()) == ()


# --- detect --------------------------------------------------------------------------------


HostFiles = tuple[Path, Path]  # /proc/self/mountinfo and /proc/self/cgroup stand-ins


def detect_on(files: HostFiles, fs: FakeKernel, instance: str = "") -> LimitBackend:
    return detect(instance=instance, mountinfo=files[0], proc_cgroup=files[1], fs=fs)


def host_files(tmp_path: Path, mounts: list[str], cgroup: list[str]) -> HostFiles:
    (tmp_path / "mountinfo").write_text(
        "".join(f"{i + 30} 23 0:{i + 40} {m}\n" for i, m in enumerate(mounts))
    )
    (tmp_path / "cgroup").write_text("".join(f"{line}\n" for line in cgroup))
    return tmp_path / "mountinfo", tmp_path / "cgroup"


def test_detect_picks_v2_when_it_delegates(tmp_path: Path) -> None:
    fs = FakeKernel(tmp_path / "cg", V2_FILES)
    make_cgroup(fs, tmp_path / "cg" / "system.slice" / "elasticd.service")
    files = host_files(
        tmp_path,
        [f"/ {tmp_path}/cg rw,nosuid - cgroup2 cgroup2 rw,nsdelegate"],
        ["0::/system.slice/elasticd.service"],
    )
    backend = detect_on(files, fs, "node-1")
    assert backend.name == "cgroup2"
    assert isinstance(backend, CgroupV2Backend)
    assert backend.base == tmp_path / "cg" / "system.slice" / "elasticd.service" / V2_JOBS / "node-1"


def hybrid(tmp_path: Path, deny: tuple[str, ...] = ()) -> tuple[FakeKernel, HostFiles]:
    """This machine's layout: v1 hierarchies, and a unified one offering only hugetlb.

    ``deny``: where creating a cgroup is not permitted (once the tree is set up).
    """
    fs = FakeKernel(tmp_path, {**V1_MEMORY_FILES, **V1_CPU_FILES, **V2_FILES})
    make_cgroup(fs, tmp_path / "unified", cgroup_controllers="hugetlb")
    make_cgroup(fs, tmp_path / "mem" / "process_api" / "abc")
    make_cgroup(fs, tmp_path / "cpu")
    files = host_files(
        tmp_path,
        [
            "/ /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755",
            f"/ {tmp_path}/cpu rw,relatime - cgroup cgroup rw,cpu",
            f"/ {tmp_path}/mem rw,relatime - cgroup cgroup rw,memory",
            f"/ {tmp_path}/unified rw,relatime - cgroup2 cgroup2 rw",
        ],
        ["4:memory:/process_api/abc", "1:cpu:/", "0::/"],
    )
    fs.deny = deny
    return fs, files


def test_detect_picks_v1_on_a_hybrid_host(tmp_path: Path) -> None:
    fs, files = hybrid(tmp_path)
    backend = detect_on(files, fs)
    assert isinstance(backend, CgroupV1Backend)
    assert backend.memory_base == tmp_path / "mem" / "process_api" / "abc" / V1_JOBS
    assert backend.cpu_base == tmp_path / "cpu" / V1_JOBS


def test_detect_v1_without_a_writable_cpu_hierarchy(tmp_path: Path) -> None:
    fs, files = hybrid(tmp_path, deny=(f"{tmp_path}/cpu/",))
    backend = detect_on(files, fs)
    assert isinstance(backend, CgroupV1Backend) and backend.cpu_base is None


def test_detect_falls_back_to_rlimits_and_checks_the_instance(tmp_path: Path) -> None:
    fs, files = hybrid(tmp_path, deny=("/mem/",))
    assert detect_on(files, fs).name == "rlimit"
    (tmp_path / "bare").mkdir()
    nothing = host_files(tmp_path / "bare", [], ["0::/"])
    assert detect_on(nothing, fs).name == "rlimit"
    assert detect(mountinfo=tmp_path / "absent", proc_cgroup=tmp_path / "absent").name == "rlimit"
    with pytest.raises(LimitError):
        detect(instance="../x", mountinfo=tmp_path / "absent", proc_cgroup=tmp_path / "absent")


def test_mountinfo_bind_mounts_and_escapes() -> None:
    mounts = parse_mountinfo(
        "1 0 0:1 / / rw - ext4 /dev/sda rw\n"
        "2 1 0:2 /docker/abc /sys/fs/cgroup/mem\\040ory rw - cgroup cgroup rw,memory\n"
        "3 1 0:3 / /sys/fs/cgroup/cpu,cpuacct rw shared:5 - cgroup cgroup rw,cpu,cpuacct\n"
        "garbage\n"
    )
    assert [m.point for m in mounts] == [Path("/sys/fs/cgroup/mem ory"), Path("/sys/fs/cgroup/cpu,cpuacct")]
    ours = parse_proc_cgroup("5:memory:/docker/abc/sub\n3:cpu,cpuacct:/x\n0::/\nbad\n")
    assert own_dir(mounts, ours, "memory") == Path("/sys/fs/cgroup/mem ory/sub")
    assert own_dir(mounts, ours, "cpu") == Path("/sys/fs/cgroup/cpu,cpuacct/x")
    assert own_dir(mounts, ours, None) is None
    assert own_dir(mounts, parse_proc_cgroup("5:memory:/elsewhere\n"), "memory") is None
