"""Python stacks as py-spy reports them (``py-spy dump --json``), checked and summarised. Pure.

py-spy runs as the job's user against a process the job controls, so its output is untrusted:
it is size-bounded by the caller, decoded into typed records here (anything else is an error,
never a crash), and only ever shown as text.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

MAX_THREADS = 512
MAX_FRAMES = 256
MAX_TEXT = 512  # a function or file name
COLLECTIVE_PATHS = ("torch/distributed/",)  # a rank in here waits for the others


class StackError(ValueError):
    """py-spy's output did not read as stacks."""


@dataclass(frozen=True)
class Frame:
    function: str
    filename: str
    line: int

    def text(self) -> str:
        """``train.py:42 in step`` (the file's base name: enough to find it, short in a status)."""
        return f"{os.path.basename(self.filename)}:{self.line} in {self.function}"


@dataclass(frozen=True)
class ThreadStack:
    os_thread_id: int
    name: str
    active: bool
    frames: tuple[Frame, ...]  # innermost first


def _text(value: Any, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise StackError(f"{what} is not text")
    return value[:MAX_TEXT]


def _int(value: Any, what: str) -> int:
    if type(value) is not int:
        raise StackError(f"{what} is not an integer")
    return value


def parse_dump(data: bytes) -> tuple[ThreadStack, ...]:
    """The threads of one ``py-spy dump --json`` of one process."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise StackError(f"not JSON: {exc}") from None
    if not isinstance(doc, list):
        raise StackError("not a list of threads")
    threads = []
    for item in doc[:MAX_THREADS]:
        if not isinstance(item, dict) or not isinstance(item.get("frames"), list):
            raise StackError("a thread without frames")
        frames = tuple(
            Frame(
                function=_text(f.get("name"), "a function name"),
                filename=_text(f.get("filename"), "a file name"),
                line=_int(f.get("line", 0), "a line number"),
            )
            for f in item["frames"][:MAX_FRAMES]
            if isinstance(f, dict) or _bad("a frame")
        )
        threads.append(
            ThreadStack(
                os_thread_id=_int(item.get("os_thread_id", 0) or 0, "a thread id"),
                name=_text(item.get("thread_name"), "a thread name"),
                active=item.get("active") is True,
                frames=frames,
            )
        )
    return tuple(threads)


def _bad(what: str) -> bool:
    raise StackError(f"{what} is not an object")


def main_thread(threads: tuple[ThreadStack, ...], pid: int) -> ThreadStack | None:
    """The process's main thread (its thread id is the pid), else the first one listed."""
    for t in threads:
        if t.os_thread_id == pid:
            return t
    return threads[0] if threads else None


def digest(thread: ThreadStack | None) -> str:
    """What stays the same while a thread does not move: its frames, not their timing."""
    if thread is None:
        return ""
    text = "\n".join(f"{f.filename}:{f.line}:{f.function}" for f in thread.frames)
    return hashlib.sha256(text.encode(errors="replace")).hexdigest()[:16]


def innermost(thread: ThreadStack | None) -> str:
    return thread.frames[0].text() if thread is not None and thread.frames else ""


def in_collective(thread: ThreadStack | None) -> bool:
    """Waiting inside torch.distributed: a rank that waits for another is not the cause of a hang."""
    if thread is None:
        return False
    return any(p in f.filename for f in thread.frames for p in COLLECTIVE_PATHS)


def render(rank: int, pid: int, threads: tuple[ThreadStack, ...]) -> str:
    """The stacks file's text, as ``py-spy dump`` prints it (innermost frame first)."""
    lines = [f"rank {rank}, process {pid}"]
    for t in threads:
        state = "active" if t.active else "idle"
        name = f' "{t.name}"' if t.name else ""
        main = " (main thread)" if t.os_thread_id == pid else ""
        lines.append(f"\nThread {t.os_thread_id} ({state}){name}{main}")
        lines.extend(f"    {f.function} ({f.filename}:{f.line})" for f in t.frames)
    return "\n".join(lines) + "\n"
