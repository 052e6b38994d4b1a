"""``elasticctl``: submit, status, kill, rm, logs, events, nodes, drain, undrain, ping, completion.

Exit codes (``elasticctl.exits``): 0 success; 1 the daemon cannot be reached; 2 usage error; 3 the
daemon reported an error; 4 a followed job ended FAILED or KILLED.

The command line is ``elasticctl.parser``, built from ``elasticctl.commands.REGISTRY``: one module
per command holds its arguments and what runs it.
"""

from __future__ import annotations

from elasticctl.client import Client, ExitCodes, guarded
from elasticctl.commands import REGISTRY
from elasticctl.commands.base import LocalCommand
from elasticctl.exits import EXIT_DAEMON_ERROR, EXIT_UNREACHABLE, EXIT_USAGE
from elasticctl.parser import build_parser
from elasticd.control.address import default_socket_path


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    command = REGISTRY[ns.command]
    if isinstance(command, LocalCommand):  # needs no daemon
        return command.run(parser, ns)
    client = Client(ns.socket or default_socket_path(), timeout_s=ns.timeout)
    codes = ExitCodes(EXIT_USAGE, EXIT_UNREACHABLE, EXIT_DAEMON_ERROR)
    return guarded("elasticctl", client, lambda: int(command.run(client, ns)), codes)
