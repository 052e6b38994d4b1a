"""Shell completion for ``elasticctl``, generated from its own argparse parser by ``shtab``:
``elasticctl completion bash|zsh`` prints the script, so it never drifts from the commands."""

from __future__ import annotations

import argparse

import shtab

SHELLS = ("bash", "zsh")

# Arguments that name paths complete as paths (everything else: the parser's flags and choices).
_PATHS = {"target": shtab.FILE, "cwd": shtab.DIRECTORY, "python": shtab.FILE, "socket": shtab.FILE}


def _annotate(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if action.dest in _PATHS:
            setattr(action, "complete", _PATHS[action.dest])  # shtab's extension point  # noqa: B010
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _annotate(sub)


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser`` for ``shell`` (one of ``SHELLS``)."""
    _annotate(parser)
    return shtab.complete(parser, shell=shell)
