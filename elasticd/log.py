"""structlog setup, done once by the entry point (never at import time).

JSON lines when stderr is not a TTY (journald, files, tests), readable console output on a TTY.
Events are ``noun.verb`` names with key=value pairs: ``log.info("job.started", job=..., world_size=2)``.
What the metrics and the cluster's event history use is published as a typed record instead
(``elasticd.happenings``), whose log line is one more subscriber of that bus.
"""

from __future__ import annotations

import logging
import sys
from typing import Any


def configure(fmt: str = "auto", level: str = "info") -> None:
    import structlog

    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: Any = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


class _Logger:
    """structlog's logger for ``name``, looked up on its first use.

    ``import structlog`` (and the asyncio it imports) costs ~45 ms; every ``elasticctl`` call
    would pay it for the modules it shares with the daemon (``decode``, say)
    although it never logs through them. So modules keep ``_log = log.get(...)`` at import time,
    and structlog is imported when something is first logged (or ``configure`` runs)."""

    __slots__ = ("_logger", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, method: str) -> Any:
        if self._logger is None:
            import structlog

            self._logger = structlog.get_logger(self._name)
        return getattr(self._logger, method)


def get(name: str) -> Any:
    return _Logger(name)
