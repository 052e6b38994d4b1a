"""``elasticctl``'s command line, built from the commands' registry (``elasticctl.commands``):
each command's module adds its own arguments to its subparser.

Parsing any command line imports no command's implementation: ``elasticctl submit`` is on the
path of every job's start, and what it imports before its request leaves is start-up time.
Every default of a request's argument comes from its dataclass in ``elasticd.wire``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from elasticctl.commands import REGISTRY
from elasticctl.commands.base import Command
from elasticd import __version__


def _connection_options(p: argparse.ArgumentParser, after_command: bool) -> None:
    """``--socket`` and ``--timeout`` go before or after the command (after wins)."""
    socket_default: object = argparse.SUPPRESS if after_command else None
    timeout_default: object = argparse.SUPPRESS if after_command else 15.0
    p.add_argument("--socket", type=Path, default=socket_default,
                   help="control socket (default: $ELASTICD_SOCKET or the system one)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=timeout_default,
                   help="seconds to wait for the daemon (default 15)")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; ``ns.command`` names the command to run (its ``REGISTRY`` key)."""
    p = argparse.ArgumentParser(prog="elasticctl", description="Control the local elasticd.")
    p.add_argument("--version", action="version", version=f"elasticctl {__version__}")
    _connection_options(p, after_command=False)
    common = argparse.ArgumentParser(add_help=False)
    _connection_options(common, after_command=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in REGISTRY.values():
        if isinstance(command, Command):  # asks the daemon: takes --socket and --timeout too
            sp = sub.add_parser(command.name, help=command.help, parents=[common])
        else:
            sp = sub.add_parser(command.name, help=command.help, epilog=command.epilog)
        command.arguments(sp)
    return p
