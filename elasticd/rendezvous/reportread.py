"""Each node's report of its part in a job (``reports/<job>/<node>``), read on demand, in pages.

A report is what ``status`` shows of a member: its state, devices, pids and progress. Every node
rewrites its own on every step and every progress publish, so with the reports in the read of
every job each daemon's scan read N records per round of an N-node job, and every change of
one again. They are outside that read (``Keys.job_reports``) and outside every watch; no
decision reads them. What shows them reads one job's here: ``status <job>``, ``kill`` (whether
any node still runs workers), ``logs``.

The pages are separate requests, so not of one revision: a report is a node's own view, shown
as it was last published, and each one read is whole. A report that does not decode is left
out and logged (``report_invalid``): it belongs to one node's display, and decides nothing.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

from elasticd.decode import DecodeError, parse_json, report_invalid
from elasticd.etcd.keyref import KeyKind
from elasticd.etcd.keys import Keys
from elasticd.etcd.kv import KV
from elasticd.etcd.pages import read_pages
from elasticd.etcd.types import KeyValue
from elasticd.rendezvous.jobread import Frozen, JobRead
from elasticd.rendezvous.model import NodeStatus
from elasticd.terms.spec import MAX_NODES

R = TypeVar("R", bound=JobRead)
PAGE = 500  # reports per request (a few hundred bytes each; progress makes them larger)
MAX_REPORTS = MAX_NODES + 1024  # keys under one job's reports that a read takes (a bound)


def read_reports(kv: KV, keys: Keys, job_id: str, page: int = PAGE) -> list[KeyValue]:
    """Every report of ``job_id`` (blocking: run it in a thread), in pages of at most ``page``
    keys, at most ``MAX_REPORTS`` of them."""
    return read_pages(kv, keys.job_reports(job_id), page, MAX_REPORTS)


def statuses(keys: Keys, job_id: str, kvs: list[KeyValue]) -> dict[str, NodeStatus]:
    """Each node's status from ``kvs`` (the job's reports), by node; a bad one left out, logged."""
    out: dict[str, NodeStatus] = {}
    for kv in kvs:
        try:
            ref = keys.parse(kv.key)
            if ref.kind is not KeyKind.NODE_STATUS or ref.job != job_id:
                raise DecodeError("", "no such key: a job's reports have no record of this name")
            out[ref.node] = NodeStatus.from_json(parse_json(kv.value))
        except DecodeError as exc:
            report_invalid(keys.relative(kv.key), kv.mod_revision, str(exc)[:300], job=job_id)
    return out


def with_reports(read: R, found: dict[str, NodeStatus]) -> R:
    """``read`` with ``found`` as its nodes' statuses, as a copy: it may be the shared read of
    every job."""
    return replace(read, node_status=Frozen(found))
