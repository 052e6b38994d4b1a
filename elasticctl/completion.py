"""Shell completion for ``elasticctl``, generated from its own argparse parser by ``shtab``:
``elasticctl completion bash|zsh`` prints the script, so it never drifts from the commands."""

from __future__ import annotations

import argparse
from typing import Any


def _annotate(parser: argparse.ArgumentParser, paths: dict[str, Any]) -> None:
    for action in parser._actions:
        if action.dest in paths:
            setattr(action, "complete", paths[action.dest])  # shtab's extension point  # noqa: B010
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _annotate(sub, paths)


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser`` for ``shell`` (one of ``elasticctl.commands.completion.SHELLS``).

    shtab is imported here, not at the top: it costs every other command ~50 ms of start-up."""
    import shtab

    # Arguments that name paths complete as paths (everything else: the parser's flags and choices).
    paths = {"target": shtab.FILE, "cwd": shtab.DIRECTORY, "python": shtab.FILE, "socket": shtab.FILE}
    _annotate(parser, paths)
    return shtab.complete(parser, shell=shell)
