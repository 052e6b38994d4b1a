"""The commit of a ``torch.distributed.checkpoint`` directory written behind (``dcpfiles``): it
happens only once every rank's record of the step is in, replaces ``.metadata`` whole, and removes
what older steps left, never a newer step's files."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

pytest.importorskip("torch")

from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.storage import WriteResult

from elasticd.workers.snapshot_program import dcpfiles

pytestmark = pytest.mark.torch


def record(path: Path, rank: int, step: int) -> MetadataIndex:
    index = MetadataIndex(f"w{rank}")
    info = _StorageInfo(f"__{rank}_s{step}_0.distcp", 0, 8)
    (path / dcpfiles.results_name(rank, step)).write_bytes(pickle.dumps([WriteResult(index, 8, info)]))
    (path / f"__{rank}_s{step}_0.distcp").write_bytes(b"x" * 8)
    return index


def test_a_step_whose_every_record_is_in_is_committed_and_older_files_go(tmp_path: Path) -> None:
    (tmp_path / "__0_0.distcp").write_bytes(b"torch's own naming")
    record(tmp_path, 0, 2)
    first, second = record(tmp_path, 0, 3), record(tmp_path, 1, 3)
    record(tmp_path, 1, 4)  # another rank's next step, written while this one commits
    assert dcpfiles.commit(tmp_path, Metadata({}), 3, 2, timeout_s=5)
    meta = pickle.loads((tmp_path / dcpfiles.METADATA).read_bytes())
    assert {i: s.relative_path for i, s in meta.storage_data.items()} == {
        first: "__0_s3_0.distcp",
        second: "__1_s3_0.distcp",
    }
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != dcpfiles.LOCK) == [
        ".__1_s4.results",
        ".metadata",
        "__0_s3_0.distcp",
        "__1_s3_0.distcp",
        "__1_s4_0.distcp",
    ]


def test_a_step_a_rank_never_wrote_is_not_committed_and_the_last_one_stays_whole(tmp_path: Path) -> None:
    record(tmp_path, 0, 3), record(tmp_path, 1, 3)
    assert dcpfiles.commit(tmp_path, Metadata({}), 3, 2, timeout_s=5)
    committed = (tmp_path / dcpfiles.METADATA).read_bytes()
    record(tmp_path, 0, 4)  # rank 1 died before its shard of step 4
    assert not dcpfiles.commit(tmp_path, Metadata({}), 4, 2, timeout_s=0.2)
    assert (tmp_path / dcpfiles.METADATA).read_bytes() == committed
    assert (tmp_path / "__0_s3_0.distcp").exists() and (tmp_path / "__1_s3_0.distcp").exists()


def test_a_step_prefix_names_the_rank_and_the_step() -> None:
    assert dcpfiles.prefix(3, 17).prefix == "__3_s17_"
    assert dcpfiles.results_name(3, 17) == ".__3_s17.results"


def test_a_keepers_record_commits_a_step_and_an_older_step_never_replaces_a_newer_one(
    tmp_path: Path,
) -> None:
    record(tmp_path, 0, 5), record(tmp_path, 1, 5)
    assert dcpfiles.commit(tmp_path, Metadata({}), 5, 2, timeout_s=5)
    assert dcpfiles.committed(tmp_path) == 5
    newest = (tmp_path / dcpfiles.METADATA).read_bytes()
    index = MetadataIndex("w0")  # a keeper's shard of step 4, written after a failure
    info = _StorageInfo("__0_s4k_0.distcp", 0, 8)
    (tmp_path / dcpfiles.results_name(0, 4, dcpfiles.KEEPER)).write_bytes(
        pickle.dumps([WriteResult(index, 8, info)])
    )
    record(tmp_path, 1, 4)
    assert dcpfiles.commit(tmp_path, Metadata({}), 4, 2, timeout_s=5)  # nothing to do: 5 is in
    assert (tmp_path / dcpfiles.METADATA).read_bytes() == newest and dcpfiles.committed(tmp_path) == 5


def test_a_keepers_record_is_as_good_as_a_workers(tmp_path: Path) -> None:
    index = MetadataIndex("w0")
    info = _StorageInfo("__0_s2k_0.distcp", 0, 8)
    (tmp_path / dcpfiles.results_name(0, 2, dcpfiles.KEEPER)).write_bytes(
        pickle.dumps([WriteResult(index, 8, info)])
    )
    (tmp_path / "__0_s2k_0.distcp").write_bytes(b"x" * 8)
    assert dcpfiles.commit(tmp_path, Metadata({}), 2, 1, timeout_s=5)
    assert dcpfiles.committed(tmp_path) == 2
