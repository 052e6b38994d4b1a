"""elasticctl's argument handling (no daemon needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from elasticctl.cli import build_parser


@pytest.mark.parametrize(
    "argv",
    [
        ["--timeout", "3", "--socket", "/s", "ping"],
        ["ping", "--timeout", "3", "--socket", "/s"],
        ["--socket", "/other", "--timeout", "9", "ping", "--timeout", "3", "--socket", "/s"],
    ],
)
def test_connection_options_before_or_after_the_command(argv: list[str]) -> None:
    ns = build_parser().parse_args(argv)
    assert ns.timeout == 3.0 and ns.socket == Path("/s")


def test_defaults_without_connection_options() -> None:
    ns = build_parser().parse_args(["status"])
    assert ns.timeout == 15.0 and ns.socket is None


def test_submit_script_args_after_double_dash() -> None:
    ns = build_parser().parse_args(["submit", "--nproc-per-node", "4", "train.py", "--", "--lr", "0.1"])
    assert ns.target == "train.py" and ns.script_args == ["--lr", "0.1"] and ns.nproc_per_node == 4
    keep = build_parser().parse_args(["submit", "train.py", "--", "--", "x"])
    assert keep.script_args == ["--", "x"]
