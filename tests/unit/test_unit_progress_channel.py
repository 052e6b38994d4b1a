"""The progress pipe with a real pipe and real writers: reports arrive, junk is counted, a flood
is read in bounded pieces, and a worker of another user can reopen it as a file."""

from __future__ import annotations

import asyncio
import os
import subprocess

import pytest

from elasticd.progress import channel as ch
from elasticd.progress.channel import ProgressChannel
from elasticd.progress.protocol import Report, StepReport

NOBODY = 65534


async def _collect(channel: ProgressChannel, until: int) -> list[Report]:
    got: list[Report] = []
    done = asyncio.get_running_loop().create_future()

    def on_report(report: Report) -> None:
        got.append(report)
        if len(got) >= until and not done.done():
            done.set_result(None)

    channel.start(on_report)
    await asyncio.wait_for(done, 30)
    return got


def test_reports_and_junk() -> None:
    async def main() -> None:
        channel = ProgressChannel()
        os.write(channel.write_fd, b"step 1\nnonsense\nstep 2\n")
        got = await _collect(channel, 2)
        assert got == [StepReport(1), StepReport(2)] and channel.junk == 1
        channel.close()
        assert channel.read_fd == -1 and channel.write_fd == -1

    asyncio.run(main())


def test_a_flood_is_read_in_bounded_pieces_and_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    real_read = os.read

    def counting_read(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        reads.append(len(data))
        return data

    async def main() -> None:
        channel = ProgressChannel()
        flood = b"x" * 60_000 + b"\nstep 9\n"
        monkeypatch.setattr(os, "read", counting_read)
        os.write(channel.write_fd, flood)  # fits in the pipe: no writer needed
        got = await _collect(channel, 1)
        assert got == [StepReport(9)] and channel.junk == 1
        assert max(reads) <= ch.READ_BUDGET and channel.bytes_read == len(flood)
        assert channel.pauses >= 1  # more than RATE_BYTES arrived at once
        channel.close()

    asyncio.run(main())


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_another_user_reopens_the_pipe_by_name() -> None:
    async def main() -> None:
        channel = ProgressChannel((NOBODY, NOBODY))
        fd = channel.write_fd

        def as_nobody() -> None:
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)

        proc = subprocess.Popen(
            ["/bin/sh", "-c", f"echo step 5 > /dev/fd/{fd} && echo step 6 > /dev/fd/{fd}"],
            pass_fds=(fd,),
            preexec_fn=as_nobody,
        )
        channel.close_write()
        got = await _collect(channel, 2)
        assert await asyncio.to_thread(proc.wait) == 0
        assert got == [StepReport(5), StepReport(6)]
        channel.close()

    asyncio.run(main())
