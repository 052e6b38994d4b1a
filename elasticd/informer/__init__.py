"""One local copy of key ranges of etcd, read by everyone: the informer.

``store.py`` (pure) holds the keys of the ranges with their revisions, each group of keys (a
job's) decoded once per change by the caller's decoder, under a bound on keys and bytes.
``informer.py`` keeps it current: it lists the ranges at one revision, then watches them from
the revision after (``KV.watch_from``), and lists again when the watch is lost or its revision
was compacted. A writer that must see its own write waits for the copy to reach the write's
revision (``Informer.wait_for``); nobody else knows that the copy is a cache. What is computed
from the copy (a queue, a reply listing every group) is asked of it (``derived.py``: made once
per change of the copy, and per group once per change of that group's read).

Imports ``etcd/`` (the KV seam) and the small helpers of L0 only; what a group decodes to is
the caller's (``manager/`` decodes jobs with ``rendezvous/jobparse.py``).
"""
