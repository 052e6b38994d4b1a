"""Submits per user per minute: a sliding window per uid, kept in memory by one daemon.

Each node counts the submits made through its own socket (a user who spreads submits over N
nodes gets N times the rate; the job limit, counted from etcd, still holds cluster-wide). The
window is exact to the second: submits are counted in one-second buckets, and a bucket is
counted until a full window has passed since its second ended, so that no 60-second span ever
holds more admitted submits than the limit (a submit may wait up to a second longer than an
exact log of times would make it).

Memory is bounded whatever the limit: at most ``window_s + 1`` buckets per user, at most
``max_users`` users tracked. A user idle for a whole window is forgotten (the least recently
active first, on each call); past ``max_users`` active users the least recently active is
forgotten too (that user's count starts afresh: a local user would need thousands of accounts
for this to matter). A refused submit is not counted, so a user who keeps trying is admitted
again as soon as the window allows.

Pure: ``now`` is an argument (monotonic seconds), no clock and no I/O.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

WINDOW_S = 60.0
MAX_USERS = 1024


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    used: int  # submits counted in the window before this one
    retry_after_s: float = 0.0  # refused: seconds until the window has room again


class SubmitWindow:
    """Per uid, the submits admitted in the last ``window_s`` seconds (module doc)."""

    def __init__(self, window_s: float = WINDOW_S, max_users: int = MAX_USERS) -> None:
        if window_s <= 0 or max_users < 1:
            raise ValueError("need window_s > 0 and max_users >= 1")
        self.window_s = window_s
        self.max_users = max_users
        # uid -> (second, submits in it), oldest first; the least recently admitted user first
        self._users: OrderedDict[int, deque[tuple[int, int]]] = OrderedDict()

    def __len__(self) -> int:
        """How many users are tracked."""
        return len(self._users)

    def admit(self, uid: int, limit: int, now: float) -> RateDecision:
        """Count one submit of ``uid`` at ``now`` unless ``limit`` (0: none) were counted in the
        window already."""
        self._forget_idle(now)
        buckets = self._users.get(uid)
        if buckets is not None:
            while buckets and not self._counts(buckets[0][0], now):
                buckets.popleft()
        used = sum(c for _, c in buckets) if buckets else 0
        if buckets and 0 < limit <= used:
            return RateDecision(False, used, max(0.0, buckets[0][0] + 1 + self.window_s - now))
        self._count(uid, buckets, math.floor(now))
        return RateDecision(True, used)

    def _counts(self, second: int, now: float) -> bool:
        """A bucket counts until a whole window has passed since its second ended."""
        return now < second + 1 + self.window_s

    def _count(self, uid: int, buckets: deque[tuple[int, int]] | None, second: int) -> None:
        if buckets is None:
            buckets = self._users[uid] = deque()
        if buckets and buckets[-1][0] >= second:  # the same second (or a clock that went back)
            last, n = buckets[-1]
            buckets[-1] = (last, n + 1)
        else:
            buckets.append((second, 1))
        self._users.move_to_end(uid)
        while len(self._users) > self.max_users:
            self._users.popitem(last=False)

    def _forget_idle(self, now: float) -> None:
        """Drop users whose last submit has left the window (they are at the front)."""
        while self._users:
            uid, buckets = next(iter(self._users.items()))
            if buckets and self._counts(buckets[-1][0], now):
                return
            del self._users[uid]
