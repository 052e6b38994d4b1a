"""The I/O side of the pre-flight check: ``workers/check_program.py`` run as the job's user, its answers read
as untrusted input.

A check server is started when a node joins a round of a ``--node-check`` job and stopped when the
round's workers start (or the job leaves); the leader's probe runs once per check. Both are
bounded: the server by its deadline (and killed with the round), the probe by
``fitness.PROBE_DEADLINE_S`` plus a margin, each answer by ``MAX_ANSWER`` bytes. A check that
hangs, crashes or answers nonsense counts as failed, with its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

from elasticd import log
from elasticd.rendezvous.fitness import PROBE_DEADLINE_S, CheckTarget, Link
from elasticd.workers.proctree.spawn import Identity, worker_preexec

_log = log.get("elasticd.check")

MAX_ANSWER = 64 << 10
START_TIMEOUT_S = 10.0  # an interpreter's start and the compute loop (without torch)
PROBE_MARGIN_S = 3.0


class CheckFailed(Exception):
    """A check process did not answer as it must: why."""


@dataclass(frozen=True)
class Runner:
    """How to run the program: the job's interpreter, identity and directory."""

    python: str
    identity: Identity | None
    cwd: str


def program() -> str:
    return resources.files("elasticd.workers").joinpath("check_program.py").read_text()


def _figure(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise CheckFailed(f"{what} is not a figure")
    return float(value)


def parse_served(line: bytes) -> tuple[int, float]:
    """The server's first line: (port, compute)."""
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise CheckFailed("its answer is not JSON") from exc
    if not isinstance(data, dict):
        raise CheckFailed("its answer is not an object")
    port = data.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise CheckFailed("its port is not a port")
    return port, _figure(data.get("compute"), "its compute")


def parse_probe(line: bytes, asked: Mapping[str, str]) -> dict[str, Link]:
    """The probe's answer, by node (``asked``: host:port -> node); a peer it did not reach in
    time is absent (not failed), one it names that was not asked is ignored."""
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise CheckFailed("its answer is not JSON") from exc
    peers = data.get("peers") if isinstance(data, dict) else None
    if not isinstance(peers, dict):
        raise CheckFailed("its answer has no peers")
    out: dict[str, Link] = {}
    for target, found in peers.items():
        node = asked.get(target)
        if node is None or not isinstance(found, dict):
            continue
        if "error" in found:
            out[node] = Link(error=str(found["error"])[:200] or "failed")
        else:
            out[node] = Link(
                _figure(found.get("rtt_s"), "a latency"), _figure(found.get("bytes_per_s"), "a rate")
            )
    return out


async def _spawn(runner: Runner, *argv: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        runner.python, "-I", "-c", program(), *argv,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True, preexec_fn=worker_preexec(runner.cwd, runner.identity), limit=MAX_ANSWER,
    )  # fmt: skip


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGKILL)


class CheckServer:
    """A running check server: its port and this node's compute figure."""

    def __init__(self, proc: asyncio.subprocess.Process, port: int, compute: float) -> None:
        self._proc = proc
        self.port = port
        self.compute = compute

    @classmethod
    async def start(cls, runner: Runner, address: str, deadline_s: float) -> CheckServer:
        proc = await _spawn(runner, "serve", address, f"{deadline_s:g}")
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)
            if not line.endswith(b"\n") or len(line) > MAX_ANSWER:
                raise CheckFailed("it did not answer" if not line else "its answer is cut or too long")
            port, compute = parse_served(line)
        except ValueError:  # longer than the reader's limit
            _kill(proc)
            await proc.wait()
            raise CheckFailed("its answer is too long") from None
        except TimeoutError:
            _kill(proc)
            await proc.wait()
            raise CheckFailed(f"it did not answer within {START_TIMEOUT_S:g} s") from None
        except BaseException:
            _kill(proc)
            await proc.wait()
            raise
        return cls(proc, port, compute)

    async def close(self) -> None:
        _kill(self._proc)
        await self._proc.wait()


def _why(exc: Exception) -> str:
    if isinstance(exc, TimeoutError):
        return f"did not answer in {PROBE_DEADLINE_S + PROBE_MARGIN_S:g} s"
    return str(exc) if isinstance(exc, CheckFailed) else "answered too long a line"


async def probe(runner: Runner, targets: Sequence[CheckTarget]) -> dict[str, Link]:
    """Measure the link to each target (node, address, check port) from this node; a failed
    probe fails every target it was to measure, with its reason."""
    asked = {f"[{a}]:{p}" if ":" in a else f"{a}:{p}": node for node, a, p in targets}
    try:
        proc = await _spawn(runner, "probe", f"{PROBE_DEADLINE_S:g}", *asked)
    except OSError as exc:
        return {node: Link(error=f"cannot start: {exc}") for node in asked.values()}
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), PROBE_DEADLINE_S + PROBE_MARGIN_S)
        if not line.endswith(b"\n") or len(line) > MAX_ANSWER:
            raise CheckFailed("it did not answer" if not line else "its answer is cut or too long")
        return parse_probe(line, asked)
    except (TimeoutError, CheckFailed, ValueError) as exc:
        why = _why(exc)
        _log.warning("check.probe_failed", why=why)
        return {node: Link(error=f"the probe {why}") for node in asked.values()}
    finally:
        _kill(proc)
        await proc.wait()


SERVE_MAX_S = 600.0  # a check server's life at most, should nothing stop it sooner


class NodeChecks:
    """One job's checks on this node: its check server while it has joined a round and not yet
    started its workers, and the leader's probes of the joiners' servers."""

    def __init__(self, runner: Runner, address: str, serve_s: float) -> None:
        self._runner = runner
        self._address = address
        self._serve_s = min(serve_s, SERVE_MAX_S)
        self._server: CheckServer | None = None

    async def offer(self, job: str) -> tuple[int, float | None]:
        """This node's check server for its join: (port, compute); (0, None) when it did not start
        (the leader then leaves this node out, saying so)."""
        await self.stop()
        try:
            self._server = await CheckServer.start(self._runner, self._address, self._serve_s)
        except (OSError, CheckFailed) as exc:
            _log.warning("check.unavailable", job=job, why=str(exc))
            return 0, None
        _log.info("check.serving", job=job, port=self._server.port, compute=round(self._server.compute))
        return self._server.port, self._server.compute

    async def links(self, targets: Sequence[CheckTarget]) -> dict[str, Link]:
        return await probe(self._runner, targets)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.close()
