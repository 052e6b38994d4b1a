"""What an ``elasticctl`` command is: its name, its help line, the arguments it adds to its
subparser, and what runs it; and the argparse types that more than one command reads.

A command's module holds what parsing needs at its top; whatever its ``run`` needs beyond the
request (following, rendering, shell completion) is imported inside ``run``, so that parsing any
command line imports none of it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import NamedTuple

from elasticctl.client import Client

Arguments = Callable[[argparse.ArgumentParser], None]


# Records, yet NamedTuples rather than frozen dataclasses: every command line builds them before
# it parses, and defining a frozen dataclass costs ~0.5 ms of start-up (a NamedTuple ~0.1 ms).
class Command(NamedTuple):
    """A command that asks the daemon: its subparser also takes ``--socket`` and ``--timeout``,
    and ``run`` gets a client for the socket and the parsed line; it returns the exit code."""

    name: str
    help: str
    arguments: Arguments
    run: Callable[[Client, argparse.Namespace], int]


class LocalCommand(NamedTuple):
    """A command that needs no daemon: ``run`` gets the whole parser and the parsed line."""

    name: str
    help: str
    arguments: Arguments
    run: Callable[[argparse.ArgumentParser, argparse.Namespace], int]
    epilog: str | None = None


def count(what: str) -> Callable[[str], int]:
    """An argparse type: an integer >= 0."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -1
        if value < 0:
            raise argparse.ArgumentTypeError(f"{what} is an integer >= 0, not {text!r}")
        return value

    return parse


def print_json(value: object) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))
