"""elasticd.trustedpath.read_secret: the etcd password file is read only when it is root's alone,
under directories only root controls; a refusal names the problem, never the content."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from elasticd.errors import ConfigError
from elasticd.trustedpath import read_secret

NOBODY = 65534
SECRET = "s3cret-pw"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand files to another uid"),
    pytest.mark.timeout(30),
]


def secret_file(directory: Path, text: str = SECRET + "\n", mode: int = 0o600) -> Path:
    directory.mkdir(mode=0o755, exist_ok=True)
    path = directory / "password"
    path.write_text(text)
    path.chmod(mode)
    return path


def refused(path: Path) -> str:
    with pytest.raises(ConfigError) as err:
        read_secret(path, "etcd_password_file")
    assert SECRET not in str(err.value)
    return str(err.value)


def test_a_root_only_file_is_read_without_its_newline(tmp_path: Path) -> None:
    assert read_secret(secret_file(tmp_path / "etc"), "etcd_password_file") == SECRET
    assert read_secret(secret_file(tmp_path / "ro", SECRET, 0o400), "etcd_password_file") == SECRET


def test_root_owned_links_are_followed_as_in_a_kubernetes_secret_volume(tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    volume.mkdir(mode=0o1777)  # a Secret volume's root: world-writable, sticky
    data = secret_file(volume / "..2026_11_25", mode=0o400)
    (volume / "..data").symlink_to(data.parent.name)
    (volume / "password").symlink_to("..data/password")
    assert read_secret(volume / "password", "etcd_password_file") == SECRET


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
def test_group_or_others_may_not_have_access(tmp_path: Path, mode: int) -> None:
    assert "chmod 600" in refused(secret_file(tmp_path / "etc", mode=mode))


def test_a_file_of_another_user_is_refused(tmp_path: Path) -> None:
    path = secret_file(tmp_path / "etc")
    os.chown(path, NOBODY, NOBODY)
    assert "owned by uid 65534" in refused(path)


def test_a_users_link_is_not_followed(tmp_path: Path) -> None:
    target = secret_file(tmp_path / "etc")
    link = tmp_path / "link"
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)
    assert "symbolic link of uid 65534" in refused(link)


def test_a_directory_everyone_may_write_is_refused(tmp_path: Path) -> None:
    path = secret_file(tmp_path / "open")
    path.parent.chmod(0o777)
    assert "writable by everyone" in refused(path)


def test_not_a_secret_file(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir(mode=0o700)
    assert "not a regular file" in refused(tmp_path / "dir")
    assert "cannot be read" in refused(tmp_path / "missing")
    assert "is empty" in refused(secret_file(tmp_path / "empty", "\n"))
    assert "larger than" in refused(secret_file(tmp_path / "big", "x" * 5000))


def test_trusted_file_is_ours_under_trusted_directories(tmp_path: Path) -> None:
    from elasticd.trustedpath import trusted_file

    safe = tmp_path / "safe"
    safe.mkdir(mode=0o755)
    f = safe / "nvml.json"
    f.write_text("{}")
    f.chmod(0o644)
    assert trusted_file(f, "fake_nvml") == f.resolve()
    f.chmod(0o666)
    with pytest.raises(ConfigError, match=r"fake_nvml .* is unsafe"):
        trusted_file(f, "fake_nvml")
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    g = open_dir / "nvml.json"
    g.write_text("{}")
    with pytest.raises(ConfigError, match="writable by everyone"):
        trusted_file(g, "fake_nvml")
