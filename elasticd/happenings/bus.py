"""The one bus the records of ``records`` travel on: ``publish`` hands a record to every
subscriber, then writes its log line.

Subscribers (the metrics, the cluster's event history) are called on the publishing thread, in
the order they subscribed: each must be quick, must not block and must not raise (one that raises
is logged and kept). The log line is the last subscriber, always there, so that what it shows has
already been counted and queued for the history.
"""

from __future__ import annotations

from collections.abc import Callable

from elasticd import log
from elasticd.happenings.records import Happening

Subscriber = Callable[[Happening], None]

_log = log.get("elasticd.happenings")
_subscribers: list[Subscriber] = []


def subscribe(subscriber: Subscriber) -> Callable[[], None]:
    """Hand every later record to ``subscriber``; returns the function that unsubscribes it."""
    _subscribers.append(subscriber)

    def unsubscribe() -> None:
        if subscriber in _subscribers:
            _subscribers.remove(subscriber)

    return unsubscribe


def publish(record: Happening) -> None:
    """Say that ``record`` happened: to every subscriber, then in the log."""
    for subscriber in list(_subscribers):
        try:
            subscriber(record)
        except Exception:
            _log.exception("log.subscriber_failed", subscriber=repr(subscriber))
    write_log_line(record)


def write_log_line(record: Happening) -> None:
    """The record's structlog line: its event name and fields, at its level."""
    getattr(_log, record.LEVEL)(record.EVENT, **record.log_fields())
