"""``elasticd``: the per-host daemon, in the foreground (systemd runs it as ``Type=notify``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from elasticd import __version__, log
from elasticd.config import OPTIONS, flag_of, load_settings
from elasticd.errors import ConfigError, EtcdUnavailable


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="elasticd",
        description="Per-host daemon for elastic, fault-tolerant PyTorch jobs. "
        "Settings come from /etc/elasticd/elasticd.toml (or --config), then ELASTICD_* "
        "environment variables, then these flags.",
    )
    p.add_argument("--version", action="version", version=f"elasticd {__version__}")
    p.add_argument(
        "--config", type=Path, metavar="FILE", help="TOML config file (default /etc/elasticd/elasticd.toml)"
    )
    for name, option in OPTIONS.items():  # one flag per setting, from the settings' own table
        if option.boolean:  # --allow-root-jobs / --no-allow-root-jobs
            p.add_argument(flag_of(name), dest=name, action=argparse.BooleanOptionalAction, help=option.help)
        else:
            p.add_argument(
                flag_of(name), dest=name, metavar=option.metavar, choices=option.choices, help=option.help
            )
    return p


def main(argv: list[str] | None = None) -> int:
    args = vars(build_parser().parse_args(argv))
    config = args.pop("config")
    try:
        settings = load_settings(config, os.environ, args)
    except ConfigError as exc:
        print(f"elasticd: error: {exc}", file=sys.stderr)
        return 2
    log.configure(settings.log_format, settings.log_level)
    from elasticd.daemon.app import Daemon  # after logging is configured

    try:
        return asyncio.run(Daemon(settings).run())
    except (ConfigError, EtcdUnavailable) as exc:
        log.get("elasticd").error("daemon.failed", error=str(exc))
        print(f"elasticd: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1


if __name__ == "__main__":
    raise SystemExit(main())
