"""``elasticctl completion bash|zsh``: the shell completion script, generated from the parser
itself (``elasticctl.completion``, imported when it runs: shtab costs ~50 ms)."""

from __future__ import annotations

import argparse

from elasticctl.commands.base import LocalCommand

SHELLS = ("bash", "zsh")  # what ``elasticctl.completion`` writes a script for


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("shell", choices=SHELLS)


def run(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> int:
    from elasticctl import completion

    print(completion.script(parser, ns.shell), end="")
    return 0


COMMAND = LocalCommand(
    "completion",
    "print a shell completion script (bash or zsh)",
    arguments,
    run,
    epilog="e.g. `source <(elasticctl completion bash)` in ~/.bashrc",
)
