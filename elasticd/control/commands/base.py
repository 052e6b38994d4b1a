"""What a control command is: a name, a typed argument dataclass (from ``elasticd.wire``), and an
async handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from elasticd.manager.access import Access, Caller
from elasticd.manager.service import CommandService

A = TypeVar("A")


@dataclass(frozen=True)
class Command(Generic[A]):
    """A control command. ``access`` is enforced by ``CommandService.authorize`` before the handler
    runs (handlers hold no permission checks); for job-level access, the job is the argument
    named ``job`` (absent or None: the command acts node-wide, which only root may do).
    ``admin_option`` names the option a request uses that only admins may (None: none), which
    ``authorize`` checks too."""

    name: str
    args: type[A]
    handler: Callable[[CommandService, A, Caller], Awaitable[Any]]
    access: Access
    admin_option: Callable[[A], str | None] = field(default=lambda args: None)

    def job_of(self, args: A) -> str | None:
        job = getattr(args, "job", None)
        return job if isinstance(job, str) else None

    @property
    def help(self) -> str:
        doc = self.handler.__doc__ or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""
