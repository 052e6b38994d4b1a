"""elasticd.daemon.testhooks: a test's fake GPUs reach the daemon through its environment only,
never as a setting (no config key, flag or settings variable)."""

from __future__ import annotations

from pathlib import Path

import pytest

from elasticd.config import OPTIONS, load_settings
from elasticd.daemon.main import build_parser
from elasticd.daemon.testhooks import FAKE_GPUS_ENV, FAKE_NVML_ENV, FakeHardware, fake_hardware
from elasticd.errors import ConfigError


def test_none_on_a_real_host() -> None:
    assert fake_hardware({}) == FakeHardware()
    assert fake_hardware({FAKE_GPUS_ENV: "", FAKE_NVML_ENV: ""}) == FakeHardware()


def test_a_test_gives_fake_gpus_or_a_fake_nvml() -> None:
    assert fake_hardware({FAKE_GPUS_ENV: "4"}) == FakeHardware(gpus=4)
    assert fake_hardware({FAKE_NVML_ENV: "/t/nvml.json"}) == FakeHardware(nvml=Path("/t/nvml.json"))


@pytest.mark.parametrize("value", ["-1", "two", "1.5"])
def test_a_bad_count_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match=FAKE_GPUS_ENV):
        fake_hardware({FAKE_GPUS_ENV: value})


@pytest.mark.parametrize("name", ["fake_gpus", "fake_nvml", "test_fake_gpus", "test_fake_nvml"])
def test_they_are_no_settings(name: str, tmp_path: Path) -> None:
    assert name not in OPTIONS
    toml = tmp_path / "elasticd.toml"
    toml.write_text(f'{name} = "1"\n')
    with pytest.raises(ConfigError, match="unknown setting"):
        load_settings(toml, {}, {})
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--" + name.replace("_", "-"), "1"])
    assert "fake" not in build_parser().format_help()


def test_the_settings_ignore_the_hooks_variables() -> None:
    assert load_settings(None, {FAKE_GPUS_ENV: "-1", FAKE_NVML_ENV: "/x"}, {}) == load_settings(None, {}, {})
