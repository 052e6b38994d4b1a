"""A range read in pages: every key under a prefix, no response larger than a page.

For the ranges that hold one key per member of a job (its nodes' statuses, a round's joins),
read for one job by what shows or decides on them: at 12,500 members one response would carry
megabytes. The pages are separate requests, so not of one revision; each key read is whole.
"""

from __future__ import annotations

from elasticd.etcd.kv import KV, prefix_end
from elasticd.etcd.types import KeyValue, Query


def read_pages(kv: KV, prefix: str, page: int, bound: int) -> list[KeyValue]:
    """Every key under ``prefix`` in key order (blocking), in requests of at most ``page`` keys,
    and at most ``bound`` keys in all (the first ``bound``)."""
    start, end = prefix, prefix_end(prefix)
    read: list[KeyValue] = []
    while len(read) < bound:
        (found,) = kv.read_many([Query(start, end=end, limit=min(page, bound - len(read)))])
        read += found.kvs
        if len(found.kvs) >= found.count or not found.kvs:
            break
        start = found.kvs[-1].key + "\0"  # the next key after the last one read
    return read
