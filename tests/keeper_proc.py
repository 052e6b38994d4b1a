"""A real snapshot keeper process for tests, started as the daemon starts one (its loader and program)."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys

from elasticd.workers.proctree.helper import PIPE_BYTES
from elasticd.workers.warm.snapshotkeeper import KEEPER

CLOSE_S = 60.0


class Keeper:
    """A real keeper process, started as the daemon starts one (its loader and program)."""

    def __init__(
        self,
        bound: int = 64 << 20,
        address: str = "127.0.0.1",
        uid: int | None = None,
        python: str = sys.executable,
    ) -> None:
        """``uid``: run it as that user (and group), with ``python``, as a daemon runs a job's."""
        self.ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        src_r, src_w = os.pipe()
        fcntl.fcntl(src_w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # as ``helper.launch``: the program fits whole
        os.write(src_w, KEEPER.source())
        os.close(src_w)
        # -I -S: an interpreter that cannot import elasticd (a job's python need not): stdlib only
        argv = [python, "-I", "-S", "-c", KEEPER.loader(src_r, theirs.fileno())]
        user = {} if uid is None else {"user": uid, "group": uid, "extra_groups": [], "cwd": "/"}
        self.proc = subprocess.Popen(argv, pass_fds=(src_r, theirs.fileno()), **user)  # type: ignore[call-overload]
        os.close(src_r)
        theirs.close()
        self.ctl.send(json.dumps({"bound": bound, "address": address}).encode())
        self.socket = json.loads(self.ctl.recv(4096))["socket"]

    def close(self) -> None:
        """Close its control socket and wait for it to exit: it first writes the newest snapshot
        behind, in a child that imports torch (seconds on a loaded host: 10 s fell short beside
        the suite). One that never exits is killed, and the test fails."""
        self.ctl.close()
        try:
            self.proc.wait(CLOSE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
