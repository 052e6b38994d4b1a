"""structlog setup, done once by the entry point (never at import time), and the daemon's event bus.

JSON lines when stderr is not a TTY (journald, files, tests), readable console output on a TTY.
Events are ``noun.verb`` names with key=value pairs: ``log.info("job.started", job=..., world_size=2)``.

The log events are also the daemon's one event bus: every event that passes the level filter is
handed to the subscribers (``subscribe``) before it is rendered. Metrics and the cluster's event
history are subscribers (``elasticd.metrics``, ``elasticd.events``), so control logic only says
what happened, once, and never counts or records anything itself.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from structlog.typing import EventDict

Subscriber = Callable[[str, Mapping[str, Any]], None]
"""Called with an event's name and its fields, on the thread that logged it: it must be quick,
must not block, and must not raise (a subscriber that raises is logged and kept)."""

_subscribers: list[Subscriber] = []
_publishing = threading.local()  # a subscriber's own log events are not published again


def subscribe(subscriber: Subscriber) -> Callable[[], None]:
    """Hand every later event to ``subscriber``; returns the function that unsubscribes it."""
    _subscribers.append(subscriber)

    def unsubscribe() -> None:
        if subscriber in _subscribers:
            _subscribers.remove(subscriber)

    return unsubscribe


def publish(event: str, fields: Mapping[str, Any]) -> None:
    """Hand one event to every subscriber (the structlog processor below calls this)."""
    if getattr(_publishing, "active", False):
        return
    _publishing.active = True
    try:
        for subscriber in list(_subscribers):
            try:
                subscriber(event, fields)
            except Exception:
                get("elasticd.log").exception("log.subscriber_failed", subscriber=repr(subscriber))
    finally:
        _publishing.active = False


def _publish(_logger: Any, _method: str, event_dict: EventDict) -> Any:
    if _subscribers:
        publish(str(event_dict.get("event", "")), event_dict)
    return event_dict


class _LevelFilter:
    def __init__(self, level: int, drop: type[BaseException]) -> None:
        self._level = level
        self._drop = drop

    def __call__(self, _logger: Any, method: str, event_dict: EventDict) -> Any:
        if logging.getLevelNamesMapping().get(method.upper(), logging.ERROR) < self._level:
            raise self._drop
        return event_dict


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
            _publish,
            _LevelFilter(logging.getLevelNamesMapping()[level.upper()], structlog.DropEvent),
            structlog.processors.format_exc_info,
            renderer,
        ],
        # Subscribers see info and above whatever the level: ``log_level = "warning"`` must not
        # silence the metrics or the cluster's event history. The level applies after them.
        wrapper_class=structlog.make_filtering_bound_logger(
            min(logging.INFO, logging.getLevelNamesMapping()[level.upper()])
        ),
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
