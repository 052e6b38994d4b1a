"""Which etcd versions get a read of several ranges as pinned ranges instead of a transaction."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from elasticd.etcd.gateway import COMPACTED_TEXT, OUT_OF_RANGE
from elasticd.etcd.versions import pinned_compacted, splits_reads


def test_the_versions_whose_read_only_transactions_may_crash_split_reads() -> None:
    assert all(splits_reads(v) for v in ["3.5.0", "3.5.1", "3.5.4", "3.5.4-rc.0"])
    assert not any(splits_reads(v) for v in ["3.4.23", "3.5.5", "3.5.17", "3.6.0", "3.10.1"])


@given(st.text(max_size=20).filter(lambda v: not v.strip()[:1].isdigit()))
def test_a_version_that_does_not_parse_splits_reads(version: str) -> None:
    assert splits_reads(version)  # ranges are right on every version, a transaction only on some


def test_only_a_compacted_revision_starts_a_pinned_read_over() -> None:
    assert pinned_compacted(OUT_OF_RANGE, f"etcdserver: mvcc: {COMPACTED_TEXT}")
    assert not pinned_compacted(OUT_OF_RANGE, "etcdserver: mvcc: required revision is a future revision")
    assert not pinned_compacted(14, COMPACTED_TEXT)
