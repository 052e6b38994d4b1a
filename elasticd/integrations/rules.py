"""The integrations' decisions, without their frameworks (unit-tested with neither installed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LAST = "last"  # Lightning's ModelCheckpoint.CHECKPOINT_NAME_LAST
EXTENSION = ".ckpt"  # and its FILE_EXTENSION


def snapshotted(path: str | Path) -> bool:
    """Whether a Lightning save to ``path`` goes to memory: its "last" checkpoint (``last.ckpt``,
    ``last-v1.ckpt``), on a local path. A top-k file's name changes at every save, and each name
    a keeper holds keeps its two segments for the job's life."""
    text = str(path)
    name = Path(text).name
    return "://" not in text and name.startswith(LAST) and name.endswith(EXTENSION)


def with_step(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """A Lightning checkpoint with ``step``, the number a snapshot is ordered and logged by: its
    global step. A shallow copy: the caller's dict is left as it was."""
    step = checkpoint.get("global_step")
    if "step" in checkpoint or type(step) is not int or step < 0:
        return checkpoint
    return {**checkpoint, "step": step}


def due(step: int, last: int, every: int, max_steps: int) -> bool:
    """Whether HF's save at ``step`` also writes its checkpoint directory (the last one written
    held step ``last``): the first save past each multiple of ``every`` steps, and the last step."""
    return (every > 0 and step // every > last // every) or (max_steps > 0 and step >= max_steps)


def callback_states(held: dict[str, Any], states: list[tuple[str, Any]]) -> dict[str, Any]:
    """HF's trainer state's ``stateful_callbacks`` at a save: each exportable callback's state
    (``states``: class name and state) by class name, a list where the state held a list (several
    callbacks of one class). Unlike HF's own save, which appends to such a list at every save,
    the list holds the callbacks' current states: a save every step must not grow it."""
    out = dict(held)
    by_name: dict[str, list[Any]] = {}
    for name, state in states:
        by_name.setdefault(name, []).append(state)
    for name, current in by_name.items():
        out[name] = current if isinstance(held.get(name), list) else current[-1]
    return out


def in_loop_directories(load_best_model_at_end: bool, push_to_hub: bool) -> bool:
    """Whether HF's ``checkpoint-N`` directories are written at every save, as HF would, rather
    than only at the last step: its best-model tracking and its uploads read them."""
    return load_best_model_at_end or push_to_hub


def file_is_newer(lowest: int, highest: int, directory: int) -> bool:
    """Whether the ranks resume from elasticd's snapshot file: every rank read it, at the same
    step (``lowest`` and ``highest`` of theirs; -1 where a rank has none), newer than the step of
    the HF directory the run would resume from (-1: none)."""
    return lowest == highest and lowest > directory
