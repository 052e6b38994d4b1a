"""Why py-spy gave no stacks, as a hang's report says it: everything it printed (not only its
first write) and a signal that ended it, which may have come before its exec."""

from __future__ import annotations

import asyncio
import signal
import sys

from elasticd.progress.sampler import MAX_ERROR, _read_head, failed


def test_a_signal_is_named_with_what_the_child_said() -> None:
    said = b"E1127 fork handler: Bad file descriptor\n"
    assert failed(-signal.SIGABRT, said) == "killed by SIGABRT: E1127 fork handler: Bad file descriptor"
    assert failed(-signal.SIGKILL, b"") == "killed by SIGKILL"
    assert failed(-200, b"") == "killed by signal 200"


def test_an_exit_code_is_named_when_nothing_was_said() -> None:
    assert failed(1, b"") == "exit code 1"
    assert failed(1, b"Error: Failed to open process\n  Reason: no such process\n") == (
        "Error: Failed to open process Reason: no such process"
    )
    assert len(failed(1, b"x" * 5000)) == 300


def test_the_head_spans_every_write_and_the_rest_is_drained() -> None:
    """Two writes a moment apart (as a fork handler's line, then the program's own error) are
    both kept; a writer of far more than is kept still runs to its end."""
    code = (
        "import sys, time; sys.stderr.write('first\\n'); sys.stderr.flush(); time.sleep(0.2); "
        "sys.stderr.write('second\\n'); sys.stderr.flush(); sys.stderr.write('z' * 1000000)"
    )

    async def run() -> tuple[bytes, int]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stderr=asyncio.subprocess.PIPE
        )
        assert proc.stderr is not None
        head = await asyncio.wait_for(_read_head(proc.stderr), 30)
        return head, await asyncio.wait_for(proc.wait(), 30)

    head, code_ = asyncio.run(run())
    assert code_ == 0
    assert head.startswith(b"first\nsecond\nzzz") and len(head) == MAX_ERROR
