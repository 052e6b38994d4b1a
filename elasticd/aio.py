"""Waiting on an asyncio.Event with a timeout, without losing a cancellation.

``asyncio.wait_for`` on Python 3.11 can swallow a cancellation that arrives just as the awaited
event fires (bpo-42130); a background loop built on it may then never stop. ``asyncio.wait``
does not have that flaw.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """True if ``event`` was set within ``timeout_s``."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=timeout_s)
    finally:
        waiter.cancel()
    return bool(done)
