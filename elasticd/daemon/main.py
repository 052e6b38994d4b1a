"""``elasticd``: the per-host daemon, in the foreground (systemd runs it as ``Type=notify``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from elasticd import __version__, log
from elasticd.config import load_settings
from elasticd.errors import ConfigError, EtcdUnavailable


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="elasticd",
        description="Per-host daemon for elastic, fault-tolerant PyTorch jobs. "
        "Settings come from /etc/elasticd/elasticd.toml (or --config), then ELASTICD_* "
        "environment variables, then these flags.",
    )
    p.add_argument("--version", action="version", version=f"elasticd {__version__}")
    p.add_argument("--config", type=Path, help="TOML config file (default /etc/elasticd/elasticd.toml)")
    p.add_argument("--socket", help="control socket path")
    p.add_argument("--state-dir", help="state directory (node id, job records, embedded etcd data)")
    p.add_argument("--log-dir", help="job log directory")
    p.add_argument("--node-id", help="this node's id (default: remembered, first from the hostname)")
    p.add_argument("--address", help="address peers use to reach this host's workers")
    p.add_argument("--etcd-endpoints", help="comma-separated host:port list; none starts an embedded etcd")
    p.add_argument("--etcd-prefix", help="key prefix in etcd (default /elasticd/v1)")
    p.add_argument("--etcd-ca", help="CA bundle that signed the etcd servers' certificates (https endpoints)")
    p.add_argument("--etcd-cert", help="client certificate for etcd (its CN is the etcd user with auth on)")
    p.add_argument("--etcd-key", help="the client certificate's private key")
    p.add_argument("--lease-ttl", help="node lease TTL in seconds (default 10)")
    p.add_argument("--fake-gpus", help="pretend to have N GPUs (tests)")
    p.add_argument("--slots", help="CPU slots when there are no GPUs (default: CPU count)")
    p.add_argument("--stop-grace", help="seconds between SIGTERM and SIGKILL for workers (default 10)")
    p.add_argument(
        "--allow-root-jobs",
        action="store_const",
        const=True,
        help="run jobs submitted by root as root (off by default: they are refused)",
    )
    p.add_argument("--log-group", help="job log files are 0640 to this group (default 0600)")
    p.add_argument("--log-format", choices=["auto", "json", "console"])
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
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
