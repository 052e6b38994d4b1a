"""Per-user limits: what one user may make the cluster hold, and the rules that enforce them.

Three limits (settings in ``elasticd.config``), each with its own for root and ``admin_group``
(who is an admin is decided in one place: ``manager.access.Admins``):

- ``max_jobs_per_user``: jobs pending or running at once (jobs that ended do not count);
- ``max_submits_per_minute``: submits through one node (``jobs.rate``, the sliding window);
- ``max_spec_bytes``: a job spec's stored size (the same for everyone: it is what etcd holds).

They are checked at submit (``submit_refusal``, ``quota_refusal``) and again on every node's scan
of etcd (``over_limits``), for specs that were written around the daemon or slipped past a
submit's check (two submits at once, through two nodes). The scan's rule is admission control,
as Slurm's and Kubernetes' quotas are: it fails jobs that never ran, and never stops a job that
runs (a limit lowered under running work holds new work back until the user is under it).

Pure: no I/O; the clock is not needed (``jobs.rate`` takes ``now``).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from elasticd.errors import QuotaExceeded, TooLarge
from elasticd.jobs.ticket import JobTicket
from elasticd.terms.state import EndReason

LARGEST_SHOWN = 3  # environment variables a too-large spec's message names


@dataclass(frozen=True)
class Limit:
    """One limit and the setting that sets it (messages name both). 0: no limit."""

    value: int
    setting: str

    def exceeded_by(self, used: int) -> bool:
        """Whether ``used`` is over the limit."""
        return self.value > 0 and used > self.value


@dataclass(frozen=True)
class Limits:
    """What one user may hold."""

    jobs: Limit
    submits_per_minute: Limit
    spec_bytes: Limit


@dataclass(frozen=True)
class Quotas:
    """The limits of everyone, and those of root and admins."""

    user: Limits
    admin: Limits

    def of(self, admin: bool) -> Limits:
        return self.admin if admin else self.user

    @classmethod
    def from_settings(cls, s: Any) -> Quotas:
        """From ``elasticd.config.Settings`` (or anything with its limit fields)."""
        size = Limit(s.max_spec_bytes, "max_spec_bytes")
        return cls(
            user=Limits(
                Limit(s.max_jobs_per_user, "max_jobs_per_user"),
                Limit(s.max_submits_per_minute, "max_submits_per_minute"),
                size,
            ),
            admin=Limits(
                Limit(s.admin_max_jobs_per_user, "admin_max_jobs_per_user"),
                Limit(s.admin_max_submits_per_minute, "admin_max_submits_per_minute"),
                size,
            ),
        )


UNLIMITED = Limits(
    Limit(0, "max_jobs_per_user"), Limit(0, "max_submits_per_minute"), Limit(0, "max_spec_bytes")
)
NO_QUOTAS = Quotas(UNLIMITED, UNLIMITED)


# -- sizes ------------------------------------------------------------------------------------------
def stored_size(value: Any) -> int:
    """The bytes etcd holds for ``value``: the JSON the KV clients write (``etcd/client.py``)."""
    return len(json.dumps(value, separators=(",", ":")).encode())


def largest_env(env: Mapping[str, str], n: int = LARGEST_SHOWN) -> list[tuple[str, int]]:
    """The ``n`` environment variables that take the most room in the stored spec, largest
    first: (name, bytes of ``"NAME":"value",``)."""
    sizes = [(k, stored_size(k) + stored_size(v) + 2) for k, v in env.items()]
    return sorted(sizes, key=lambda kv: (-kv[1], kv[0]))[:n]


def kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} bytes"


# -- at submit -------------------------------------------------------------------------------------
def size_refusal(spec_bytes: int, env: Mapping[str, str], limits: Limits) -> TooLarge | None:
    """A spec over ``max_spec_bytes``: the error names the limit, the setting and the largest
    environment variables (the usual cause: ``elasticctl submit`` sends the whole environment)."""
    limit = limits.spec_bytes
    if not limit.exceeded_by(spec_bytes):
        return None
    largest = largest_env(env)
    named = ", ".join(f"{k} ({kib(size)})" for k, size in largest)
    hint = (
        f"; the largest environment variables: {named} (leave them out, or use --env-clear)" if named else ""
    )
    return TooLarge(
        f"the job spec is {kib(spec_bytes)}; the limit is {kib(limit.value)} (setting {limit.setting}){hint}",
        limit=limit.value,
        used=spec_bytes,
        setting=limit.setting,
        largest_env=[{"name": k, "bytes": size} for k, size in largest],
    )


def jobs_refusal(user: str, held: int, limits: Limits) -> QuotaExceeded | None:
    """One more job for a user who holds ``held`` jobs pending or running."""
    limit = limits.jobs
    if not limit.exceeded_by(held + 1):
        return None
    return QuotaExceeded(
        f"{user} has {held} jobs pending or running; the limit is {limit.value} "
        f"(setting {limit.setting}): wait for some to end, or kill some",
        limit=limit.value,
        used=held,
        setting=limit.setting,
    )


def rate_refusal(user: str, used: int, retry_after_s: float, limits: Limits) -> QuotaExceeded:
    """A submit over ``max_submits_per_minute`` (``jobs.rate`` decided it)."""
    limit = limits.submits_per_minute
    return QuotaExceeded(
        f"{user} submitted {used} jobs through this node in the last minute; the limit is "
        f"{limit.value} a minute (setting {limit.setting}): try again in {retry_after_s:.0f}s",
        limit=limit.value,
        used=used,
        setting=limit.setting,
        retry_after_s=round(retry_after_s, 3),
    )


def held_by(tickets: Iterable[JobTicket], uid: int) -> int:
    """How many jobs pending or running ``uid`` holds (tickets are of jobs that have not ended)."""
    return sum(1 for t in tickets if t.uid == uid)


# -- on the scan -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    """A job to end FAILED, with its code and the reason its final record gives."""

    job_id: str
    code: EndReason
    reason: str


def over_limits(tickets: Iterable[JobTicket], quotas: Quotas, admins: Collection[int]) -> list[Verdict]:
    """The jobs that never ran and are over a limit of their user's (``admins``: the uids that get
    the admin limits).

    - A spec over ``max_spec_bytes``: ``too_large``.
    - Per user, the jobs that started count first (they are never failed), then the pending ones
      in submission order (time, then id: every node orders them alike); pending jobs past the
      user's job limit are ``quota_exceeded``. So the oldest waiting jobs keep their place and,
      whatever was written around the daemon, a user ends up holding no more than the limit
      (or what already runs). A job failed for its size does not count.
    """
    verdicts: list[Verdict] = []
    by_user: dict[int, list[JobTicket]] = {}
    for t in sorted(tickets, key=lambda t: (t.submitted_at, t.id)):
        limits = quotas.of(t.uid in admins)
        if not t.started and limits.spec_bytes.exceeded_by(t.spec_bytes):
            size = limits.spec_bytes
            reason = (
                f"the job spec is {kib(t.spec_bytes)}; the limit is {kib(size.value)} "
                f"(setting {size.setting}): it was written around the daemon's checks"
            )
            verdicts.append(Verdict(t.id, EndReason.TOO_LARGE, reason))
            continue
        by_user.setdefault(t.uid, []).append(t)
    for uid, held in by_user.items():
        limit = quotas.of(uid in admins).jobs
        if limit.value <= 0:
            continue
        kept = sum(1 for t in held if t.started)
        for t in held:
            if t.started:
                continue
            if kept < limit.value:
                kept += 1
                continue
            reason = (
                f"{t.user} already has {kept} jobs pending or running; the limit is {limit.value} "
                f"(setting {limit.setting})"
            )
            verdicts.append(Verdict(t.id, EndReason.QUOTA_EXCEEDED, reason))
    return verdicts
