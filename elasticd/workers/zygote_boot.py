"""The zygote's own program: it runs in the *job's* interpreter, as the submitter, never in the daemon.

Stdlib only, and never imported there by elasticd: the daemon reads this file's source from its own
package and hands it over a pipe (``zygote.LOADER``), because the job's python (Debian's
``/usr/bin/python3``, say) need not be able to import elasticd, nor enter the daemon's venv.

What it does, once per job and node:
1. read its configuration (the entry point, ``--preload`` modules) from the control socket;
2. set ``sys.path[0]`` as the worker's interpreter will, import torch (if there is one) and the
   preload modules, and check it is fit to fork: exactly one OS thread, CUDA not initialised;
3. serve fork requests (one ``SOCK_SEQPACKET`` message each, the rank's fds attached with
   ``SCM_RIGHTS``), report each child's pid, and reap its children, reporting ``exit`` with the
   raw wait status.

A forked child makes itself what a fresh ``python -u SCRIPT ARGS`` (or ``-m MODULE``) would be
(``become_worker``) and runs the entry point as ``__main__`` (``run_entry``). Exit semantics are
the interpreter's own: ``SystemExit`` propagates to the top, an uncaught exception prints its
traceback (the zygote's frames cut off) and exits 1, and the interpreter's normal finalisation
runs the script's atexit handlers and waits for its threads. The zygote registers no atexit
handler of its own.

Messages to the daemon are single JSON objects (``ready``, ``unavailable``, ``forked``,
``fork_failed``, ``exit``); the daemon treats every one of them as untrusted.
"""

from __future__ import annotations

import gc
import json
import os
import re
import select
import signal
import socket
import sys
import time
from types import TracebackType
from typing import Any

MAX_REQUEST = 4 << 20  # a fork request: argv and env of one rank
MAX_FDS = 8
SPAWN_FAILED = 127  # as elasticd.workers.spawn: the worker never got to run its entry point
PARENT_GONE = 70
FD_NAMES = ("log", "progress", "go")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
BOOT_FILE = "<elasticd-zygote>"  # the name this source is compiled under (tracebacks are cut there)


class BadRequest(ValueError):
    pass


# --- pure parts (unit-tested in the daemon's test suite) ---------------------------------------------


def _strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(what + " must be a list of strings")
    return list(value)


def parse_config(data: bytes) -> dict[str, Any]:
    """The first message: ``{"kind": "script"|"module", "entry", "preload": [...], "torch": bool}``."""
    try:
        cfg = json.loads(data)
    except ValueError as exc:
        raise BadRequest(f"config is not JSON: {exc}") from None
    if not isinstance(cfg, dict) or cfg.get("kind") not in ("script", "module"):
        raise BadRequest("config must name kind script or module")
    if not isinstance(cfg.get("entry"), str) or not cfg["entry"]:
        raise BadRequest("config must name an entry")
    if cfg["kind"] == "module" and not _MODULE.match(cfg["entry"]):
        raise BadRequest(f"not a module name: {cfg['entry'][:80]!r}")
    preload = _strings(cfg.get("preload", []), "preload")
    bad = [m for m in preload if not _MODULE.match(m)]
    if bad:
        raise BadRequest(f"not module names: {bad[:5]!r}")
    return {"kind": cfg["kind"], "entry": cfg["entry"], "preload": preload, "torch": cfg.get("torch") is True}


def parse_request(data: bytes, nfds: int) -> dict[str, Any]:
    """A fork request: ``{"id", "argv", "env", "cwd", "fds": [names of the attached fds, in order],
    "progress_fd": the number the worker's env names for the progress pipe, or null}``."""
    try:
        req = json.loads(data)
    except ValueError as exc:
        raise BadRequest(f"request is not JSON: {exc}") from None
    if not isinstance(req, dict) or req.get("op") != "fork":
        raise BadRequest("not a fork request")
    rid = req.get("id")
    if type(rid) is not int or rid < 0:
        raise BadRequest("id must be a non-negative integer")
    argv = _strings(req.get("argv"), "argv")
    env = req.get("env")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise BadRequest("env must map strings to strings")
    if any(not k or "=" in k or "\0" in k or "\0" in v for k, v in env.items()):
        raise BadRequest("env has an invalid entry")
    cwd = req.get("cwd")
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        raise BadRequest("cwd must be an absolute path")
    names = _strings(req.get("fds"), "fds")
    if len(names) != nfds or len(set(names)) != len(names) or not set(names) <= set(FD_NAMES):
        raise BadRequest(f"fds must name each attached fd once {FD_NAMES}, got {names!r} for {nfds}")
    if "log" not in names or "go" not in names:
        raise BadRequest("a log fd and a go pipe are required")
    target = req.get("progress_fd")
    if ("progress" in names) != (target is not None):
        raise BadRequest("progress_fd goes with a progress fd")
    if target is not None and (type(target) is not int or not 3 <= target < 65536):
        raise BadRequest("progress_fd must be 3..65535")
    return {"id": rid, "argv": argv, "env": env, "cwd": cwd, "fds": names, "progress_fd": target}


def script_argv(kind: str, entry: str, argv: list[str]) -> list[str]:
    """``sys.argv`` as the interpreter sets it before running the entry point (``-m`` replaces
    ``argv[0]`` with the module's file once found, as runpy does). ``argv`` is the worker's whole
    command line: ``python -u SCRIPT ARGS`` or ``python -u -m MODULE ARGS``."""
    if kind == "script":
        at = argv.index(entry, 1)
        return [entry, *argv[at + 1 :]]
    at = argv.index("-m", 1)
    return ["-m", *argv[at + 2 :]]


def path0(kind: str, entry: str, cwd: str) -> str:
    """What the interpreter puts first on ``sys.path``: the script's real directory, or the
    working directory for ``-m``."""
    if kind == "script":
        return os.path.dirname(os.path.realpath(entry))
    return cwd


# --- the zygote ----------------------------------------------------------------------------------


def _send(ctl: socket.socket, **msg: Any) -> None:
    ctl.send(json.dumps(msg).encode())


def _recv(ctl: socket.socket) -> tuple[bytes, list[int]]:
    """One message and the fds attached to it (closed here when the message was cut short)."""
    data, anc, flags, _ = ctl.recvmsg(MAX_REQUEST, socket.CMSG_SPACE(MAX_FDS * 4))
    fds = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds += [int.from_bytes(payload[i : i + 4], sys.byteorder) for i in range(0, usable, 4)]
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise BadRequest("message too long")
    return data, fds


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        return bool(cuda is not None and cuda.is_initialized())
    except Exception:
        return False


def _preload(cfg: dict[str, Any]) -> str | None:
    """Import torch (when the interpreter has it) and the preload modules; a reason on failure."""
    import importlib
    import traceback

    mods = (["torch"] if cfg["torch"] else []) + cfg["preload"]
    for mod in mods:
        try:
            importlib.import_module(mod)
        except ImportError as exc:
            if mod == "torch" and exc.name == "torch":  # a job that does not use torch
                continue
            return f"import {mod}: {traceback.format_exception_only(type(exc), exc)[-1].strip()}"
        except BaseException as exc:
            return f"import {mod}: {traceback.format_exception_only(type(exc), exc)[-1].strip()}"
    return None


def _saved_signals() -> tuple[dict[int, Any], set[int]]:
    saved: dict[int, Any] = {}
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            saved[sig] = signal.getsignal(sig)
        except (ValueError, OSError):
            continue
    return saved, set(signal.pthread_sigmask(signal.SIG_BLOCK, []))


def main(ctl_fd: int) -> None:
    ctl = socket.socket(fileno=ctl_fd)
    started = time.monotonic()
    try:
        cfg = parse_config(ctl.recv(65536))
    except BadRequest as exc:
        _send(ctl, ev="unavailable", reason=str(exc))
        return
    if not hasattr(os, "pidfd_open"):
        _send(ctl, ev="unavailable", reason=f"python {sys.version.split()[0]} has no os.pidfd_open (3.9+)")
        return
    signals = _saved_signals()
    if sys.path and sys.path[0] == "" and not getattr(sys.flags, "safe_path", False):
        sys.path[0] = path0(cfg["kind"], cfg["entry"], os.getcwd())
    reason = _preload(cfg)
    if reason is None and _threads() != 1:
        reason = f"{_threads()} threads after the imports (fork needs 1; OMP_NUM_THREADS>1 starts OpenBLAS's)"
    if reason is None and _cuda_initialized():
        reason = "CUDA was initialised by the imports"
    if reason is not None:
        _send(ctl, ev="unavailable", reason=reason)
        return
    _send(
        ctl,
        ev="ready",
        pid=os.getpid(),
        import_s=round(time.monotonic() - started, 4),
        torch="torch" in sys.modules,
        preloaded=[m for m in cfg["preload"] if m in sys.modules],
    )
    # What is imported now stays: keep the collector off it, so a child's collections (and its
    # interpreter's finalisation) neither walk it nor copy its pages (the gc module's advice).
    gc.freeze()
    req = serve(ctl)  # returns in a forked child only
    become_worker(req, cfg, signals)
    run_entry(cfg)


def serve(ctl: socket.socket) -> dict[str, Any]:
    """Fork on request and reap; returns only in a child (its request, with ``fds`` open)."""
    children: dict[int, int] = {}  # pid -> pidfd
    me = os.getpid()
    while True:
        ready, _, _ = select.select([ctl.fileno(), *children.values()], [], [])
        for pid, pidfd in list(children.items()):
            if pidfd in ready:
                _, status = os.waitpid(pid, 0)
                os.close(pidfd)
                del children[pid]
                _send(ctl, ev="exit", pid=pid, status=status)
        if ctl.fileno() not in ready:
            continue
        try:
            data, fds = _recv(ctl)
        except BadRequest as exc:
            _send(ctl, ev="fork_failed", id=-1, error=str(exc))
            continue
        if not data:  # the daemon is gone: our children die with us (their parent-death signal)
            os._exit(0)
        try:
            req = parse_request(data, len(fds))
        except BadRequest as exc:
            for fd in fds:
                os.close(fd)
            _send(ctl, ev="fork_failed", id=-1, error=str(exc))
            continue
        req["fds"] = {name: fds[i] for i, name in enumerate(req["fds"])}
        try:
            pid = os.fork()
        except OSError as exc:
            pid = -1
            _send(ctl, ev="fork_failed", id=req["id"], error=str(exc))
        if pid == 0:
            ctl.detach()  # the child closes fd by number; the object must not close it again later
            req["zygote"] = me
            req["pidfds"] = list(children.values())
            return req
        for fd in fds:
            os.close(fd)
        if pid > 0:
            children[pid] = os.pidfd_open(pid)
            _send(ctl, ev="forked", id=req["id"], pid=pid)


def _fail(message: object) -> None:
    try:
        os.write(2, f"elasticd: cannot prepare the worker: {message}\n".encode(errors="replace"))
    finally:
        os._exit(SPAWN_FAILED)


def _die_with_zygote(zygote: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    if os.getppid() != zygote:
        os._exit(PARENT_GONE)


def become_worker(req: dict[str, Any], cfg: dict[str, Any], signals: tuple[dict[int, Any], set[int]]) -> None:
    """In the child: what a fresh worker gets from its spawn (elasticd.workers.spawn) and from the
    interpreter's start. Any failure ends the child with ``SPAWN_FAILED`` and a line in its log."""
    fds = req["fds"]
    try:
        os.setsid()
        _die_with_zygote(req["zygote"])
        log = fds.pop("log")
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        # The daemon puts us in the rank's tracking cgroup (it never hands a root-opened
        # cgroup.procs to the zygote), then says go: nothing of the worker runs before.
        go = fds.pop("go")
        said = os.read(go, 1)
        os.close(go)
    except OSError as exc:
        if "log" in fds:  # fd 2 is still the zygote's (/dev/null): say it in the log instead
            os.dup2(fds["log"], 2)
        _fail(exc)
    if said != b"1":
        _fail("the daemon did not place it in its cgroup")
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        keep = 2
        if "progress" in fds:
            keep = req["progress_fd"]
            if fds["progress"] != keep:
                os.dup2(fds["progress"], keep)  # inheritable, as pass_fds makes it
                os.close(fds["progress"])
            os.set_inheritable(keep, True)
        os.closerange(3, keep)
        os.closerange(max(3, keep + 1), os.sysconf("SC_OPEN_MAX"))
        os.chdir(req["cwd"])
    except OSError as exc:
        _fail(exc)
    handlers, mask = signals
    for sig, handler in handlers.items():
        try:
            if handler is not None and signal.getsignal(sig) != handler:
                signal.signal(sig, handler)
        except (ValueError, OSError, TypeError):
            continue
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv = script_argv(cfg["kind"], cfg["entry"], req["argv"])
    if hasattr(sys, "orig_argv"):
        sys.orig_argv = list(req["argv"])
    if sys.path and sys.path[0] != "" and not getattr(sys.flags, "safe_path", False):
        sys.path[0] = path0(cfg["kind"], cfg["entry"], os.getcwd())
    _reseed()
    import importlib

    importlib.invalidate_caches()  # directory listings the zygote cached may be stale by now


def _reseed() -> None:
    """What a fresh process gets afresh: ``random`` reseeds itself at fork (os.register_at_fork);
    numpy's legacy global generator and torch's default CPU generator are seeded from the OS at
    start, so they are here."""
    np_random = sys.modules.get("numpy.random")
    if np_random is not None and hasattr(np_random, "seed"):
        np_random.seed()
    torch = sys.modules.get("torch")
    gen = getattr(torch, "default_generator", None)
    if gen is not None:
        gen.seed()


def _trimmed(tb: TracebackType | None) -> TracebackType | None:
    """A traceback without the zygote's frames (and runpy's, for a script): as ``python SCRIPT``
    would print it."""
    import runpy

    skip = {BOOT_FILE, getattr(runpy, "__file__", None)}
    while tb is not None and tb.tb_frame.f_code.co_filename in skip:
        tb = tb.tb_next
    return tb


def run_entry(cfg: dict[str, Any]) -> None:
    """Run the entry point as ``__main__`` in a fresh module, as the interpreter would."""
    import builtins
    import importlib.machinery
    import runpy
    import types

    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __annotations__={})  # as the interpreter's __main__
    sys.modules["__main__"] = main
    try:
        if cfg["kind"] == "module":
            runpy._run_module_as_main(cfg["entry"], alter_argv=True)  # type: ignore[attr-defined]  # what -m runs
        elif os.path.isfile(cfg["entry"]):
            entry = cfg["entry"]
            main.__dict__.update(
                __file__=entry,
                __cached__=None,
                __loader__=importlib.machinery.SourceFileLoader("__main__", entry),
            )
            with open(entry, "rb") as f:
                source = f.read()
            exec(compile(source, entry, "exec", dont_inherit=True), main.__dict__)
        else:  # a directory or zip file with a __main__.py
            runpy.run_path(cfg["entry"], run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        tb = _trimmed(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        raise SystemExit(1) from None


if __name__ == "__elasticd_zygote__":
    main(globals()["CTL_FD"])  # given by the loader
