"""The embedded etcd's private directories and its socket path fallback."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticd.errors import ConfigError, EtcdUnavailable
from elasticd.etcd.embedded import (
    CLIENT_SOCKET,
    PEER_SOCKET,
    SUN_PATH_MAX,
    EmbeddedEtcd,
    ensure_private_dir,
    socket_path_fits,
)
from elasticd.etcd.transport import parse_endpoint

NOBODY = 65534
FAKE_BINARY = Path("/bin/true")  # never run: these tests stop before starting etcd


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """pytest's tmp_path is often too deep for a socket path; these tests need one that is not."""
    path = Path(tempfile.mkdtemp(prefix="eu-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def owned_by_someone_else(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As root, really give ``path`` away; otherwise pretend our euid is another one."""
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY)
    else:
        real = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: real + 1)


# -- ensure_private_dir --------------------------------------------------------------------------
def test_private_dir_is_created_0700(tmp_path: Path) -> None:
    ensure_private_dir(tmp_path / "d")
    assert mode(tmp_path / "d") == 0o700


def test_private_dir_we_own_is_closed_again(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d").chmod(0o755)
    ensure_private_dir(tmp_path / "d")
    assert mode(tmp_path / "d") == 0o700


def test_private_dir_owned_by_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "d").mkdir(mode=0o700)
    owned_by_someone_else(tmp_path / "d", monkeypatch)
    with pytest.raises(ConfigError, match="owned by uid"):
        ensure_private_dir(tmp_path / "d")


def test_symlink_in_place_of_the_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "d").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="symlink"):
        ensure_private_dir(tmp_path / "d")


def test_file_in_place_of_the_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d").write_text("")
    with pytest.raises(ConfigError, match="not a directory"):
        ensure_private_dir(tmp_path / "d")


def test_data_dir_owned_by_another_user_stops_the_start(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = short_dir / "etcd"
    data.mkdir(mode=0o700)
    owned_by_someone_else(data, monkeypatch)
    etcd = EmbeddedEtcd(data, FAKE_BINARY)
    with pytest.raises(ConfigError, match="owned by uid"):
        etcd.start()
    assert etcd.pid is None


def test_symlinked_socket_dir_stops_the_start(short_dir: Path) -> None:
    data = short_dir / "etcd"
    data.mkdir(mode=0o700)
    (short_dir / "open").mkdir(mode=0o777)
    (data / "sock").symlink_to(short_dir / "open")
    with pytest.raises(ConfigError, match="symlink"):
        EmbeddedEtcd(data, FAKE_BINARY).start()


# -- where the sockets go ------------------------------------------------------------------------
def test_sockets_in_the_data_dir_when_the_path_fits(short_dir: Path) -> None:
    data = short_dir / "etcd"
    data.mkdir(mode=0o700)
    (data / "sock").mkdir(mode=0o700)
    (data / "sock" / CLIENT_SOCKET).write_text("stale")  # from a member that was SIGKILLed
    (data / "ports.json").write_text('{"client": 1, "peer": 2}')  # from an older version
    etcd = EmbeddedEtcd(data, FAKE_BINARY)
    with pytest.raises(EtcdUnavailable):
        _ = etcd.endpoint  # not started
    etcd.socket_dir = etcd._prepare_dirs()
    assert etcd.socket_dir == data / "sock" and mode(data / "sock") == 0o700 and mode(data) == 0o700
    assert not (data / "sock" / CLIENT_SOCKET).exists()
    assert etcd.endpoint == f"unix:{data}/sock/{CLIENT_SOCKET}"
    assert parse_endpoint(etcd.endpoint).path == f"{data}/sock/{CLIENT_SOCKET}"
    etcd.stop()  # never started: nothing to stop, and the data dir's sockets dir stays
    assert (data / "sock").is_dir()


def test_too_long_a_path_uses_a_private_temp_dir_removed_on_stop(tmp_path: Path) -> None:
    data = tmp_path / ("x" * (SUN_PATH_MAX - len(CLIENT_SOCKET))) / "etcd"
    assert not socket_path_fits(data / "sock")
    etcd = EmbeddedEtcd(data, FAKE_BINARY)
    etcd.socket_dir = private = etcd._prepare_dirs()
    try:
        assert private.parent == Path(tempfile.gettempdir()) and private.name.startswith("elasticd-etcd-")
        assert mode(private) == 0o700 and private.stat().st_uid == os.geteuid()
        assert socket_path_fits(private) and not (data / "sock").exists() and mode(data) == 0o700
        assert etcd.endpoint == f"unix:{private}/{CLIENT_SOCKET}"
        assert len(os.fsencode(str(private / PEER_SOCKET))) <= SUN_PATH_MAX
    finally:
        etcd.stop()
    assert not private.exists()


def test_no_short_enough_temp_dir_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / ("t" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    etcd = EmbeddedEtcd(tmp_path / ("x" * 100), FAKE_BINARY)
    with pytest.raises(ConfigError, match="short enough"):
        etcd.start()
    assert list(deep.iterdir()) == []  # the useless private dir was removed
