"""The framework integrations' decisions (``elasticd.integrations.rules``), with neither framework
imported; and elasticd without them: importing ``elasticd`` and ``elasticd.worker`` loads neither."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from elasticd.integrations.rules import (
    EXTENSION,
    LAST,
    callback_states,
    due,
    file_is_newer,
    in_loop_directories,
    snapshotted,
    with_step,
)
from tests.support import REPO


@pytest.mark.parametrize(
    ("path", "memory"),
    [
        ("/ckpt/last.ckpt", True),
        ("ckpt/last-v1.ckpt", True),
        ("/ckpt/epoch=0-step=12.ckpt", False),  # a top-k file: a new name at every save
        ("/ckpt/last.pt", False),
        ("s3://bucket/ckpt/last.ckpt", False),  # remote: Lightning's own fsspec write
        ("/ckpt/last/epoch=0.ckpt", False),
    ],
)
def test_only_lightnings_last_local_checkpoint_goes_to_memory(path: str, memory: bool) -> None:
    assert snapshotted(path) is memory


@pytest.mark.torch  # imports lightning: seconds
def test_the_names_are_lightnings() -> None:
    checkpoint = pytest.importorskip("lightning.pytorch.callbacks", reason="lightning is not installed")
    assert (LAST, EXTENSION) == (
        checkpoint.ModelCheckpoint.CHECKPOINT_NAME_LAST,
        checkpoint.ModelCheckpoint.FILE_EXTENSION,
    )


def test_a_lightning_checkpoint_is_ordered_by_its_global_step_and_left_as_it_was() -> None:
    given_ = {"global_step": 7, "state_dict": {}}
    assert with_step(given_) == {"global_step": 7, "state_dict": {}, "step": 7}
    assert given_ == {"global_step": 7, "state_dict": {}}
    assert with_step({"global_step": 7, "step": 3})["step"] == 3  # the user's own step stays
    assert "step" not in with_step({"global_step": -1})
    assert "step" not in with_step({"global_step": True})
    assert "step" not in with_step({})


@given(st.integers(1, 10), st.integers(0, 200), st.integers(1, 5))
def test_hf_writes_its_directory_once_per_multiple_of_every_and_at_the_last_step(
    every: int, max_steps: int, save_steps: int
) -> None:
    written, last = [], 0
    for step in range(save_steps, max_steps + 1, save_steps):
        if due(step, last, every, max_steps):
            written.append(step)
            last = step
    multiples = {s // every for s in range(save_steps, max_steps + 1, save_steps) if s >= every}
    assert {s // every for s in written if s >= every} == multiples  # one per multiple crossed
    assert len(written) <= len(multiples) + 1
    if max_steps % save_steps == 0 and max_steps > 0:
        assert written[-1] == max_steps


def test_hf_never_writes_its_directory_with_every_0_but_at_the_end() -> None:
    assert not due(5, 0, 0, 10)
    assert due(10, 0, 0, 10)
    assert not due(10, 0, 0, 0)  # no max_steps known: no end either


@given(st.integers(-1, 50), st.integers(-1, 50), st.integers(-1, 50))
def test_the_file_resumes_only_where_every_rank_read_it_at_one_newer_step(
    lowest: int, highest: int, directory: int
) -> None:
    assume(lowest <= highest)
    chosen = file_is_newer(lowest, highest, directory)
    assert chosen == (lowest == highest and lowest > directory)
    if lowest == -1:  # a rank without the file: HF's directories, as without it
        assert not chosen


def test_hf_reads_its_directories_for_the_best_model_and_the_hub() -> None:
    assert in_loop_directories(True, False) and in_loop_directories(False, True)
    assert not in_loop_directories(False, False)


def test_callback_states_are_the_current_ones_and_a_list_does_not_grow() -> None:
    held = {"TrainerControl": {"args": {"old": 1}}, "EarlyStopping": [{"n": 0}, {"n": 0}]}
    states = [
        ("TrainerControl", {"args": {"new": 1}}),
        ("EarlyStopping", {"n": 1}),
        ("EarlyStopping", {"n": 2}),
    ]
    out = callback_states(held, states)
    assert out == {"TrainerControl": {"args": {"new": 1}}, "EarlyStopping": [{"n": 1}, {"n": 2}]}
    assert callback_states(out, states) == out  # the next save: the same length
    assert held["TrainerControl"] == {"args": {"old": 1}}  # the caller's dict left as it was
    assert callback_states({"Other": 1}, []) == {"Other": 1}


def test_elasticd_imports_without_the_frameworks() -> None:
    code = (
        "import sys, elasticd, elasticd.worker, elasticd.integrations, elasticd.integrations.rules; "
        "print(sorted(m for m in ('lightning', 'transformers', 'accelerate') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.torch
def test_without_a_keeper_the_lightning_plugin_writes_and_reads_files_as_lightning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain torchrun: no keeper, so "last" is written at once (atomically) and read back from the
    file, and a top-k file is Lightning's own, removed by Lightning's own remove."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("lightning", reason="lightning is not installed")
    from elasticd.integrations.lightning import SnapshotCheckpointIO
    from elasticd.workers.snapshot_program.protocol import SOCKET_ENV

    monkeypatch.delenv(SOCKET_ENV, raising=False)
    io = SnapshotCheckpointIO()
    last, top = tmp_path / "ckpt" / "last.ckpt", tmp_path / "ckpt" / "epoch=0-step=3.ckpt"
    checkpoint = {"global_step": 3, "state_dict": {"w": torch.ones(2)}}
    io.save_checkpoint(checkpoint, last)
    io.save_checkpoint(checkpoint, top)
    assert sorted(p.name for p in last.parent.iterdir()) == [top.name, last.name]  # no temporary left
    loaded = io.load_checkpoint(last)
    assert loaded["step"] == 3 and torch.equal(loaded["state_dict"]["w"], torch.ones(2))
    assert "step" not in checkpoint
    io.remove_checkpoint(top)
    assert not top.exists()
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(tmp_path / "ckpt" / "last-v1.ckpt")
