"""The zygote program's middle part: what a forked child does to become the worker (stdlib only).

Like ``boot`` (the last part, which serves fork requests), this runs in the *job's* interpreter, as
the submitter, never in the daemon: the daemon hands the parts (``shared``, this, ``boot``) over one
pipe and the loader (``proctree.helper.Program.loader``) runs them, in order, in one namespace. So
names defined here (and ``shared``'s) are plain globals of ``boot`` there.

A forked child makes itself what a fresh ``python -u SCRIPT ARGS`` (or ``-m MODULE``) would be
(``become_worker``) and runs the entry point as ``__main__`` (``run_entry``). Exit semantics are
the interpreter's own: ``SystemExit`` propagates to the top, an uncaught exception prints its
traceback (the zygote's frames cut off) and exits 1, and the interpreter's normal finalisation
runs the script's atexit handlers and waits for its threads. The zygote registers no atexit
handler of its own.
"""

from __future__ import annotations

import os
import signal
import sys
from types import TracebackType
from typing import Any

if __name__ != "__elasticd_zygote__":  # the daemon's tests and mypy; in the zygote, globals already
    from elasticd.workers.zygote_program.mempolicy import prefer_nodes
    from elasticd.workers.zygote_program.shared import BOOT_FILE, PARENT_GONE, SPAWN_FAILED
    from elasticd.workers.zygote_program.title import look_like


# --- pure parts (unit-tested in the daemon's test suite) ---------------------------------------------


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


# --- in the forked child -----------------------------------------------------------------------


def _fail(message: object) -> None:
    try:
        os.write(2, f"elasticd: cannot prepare the worker: {message}\n".encode(errors="replace"))
    finally:
        os._exit(SPAWN_FAILED)


def _die_with_zygote(zygote: int) -> None:
    """SIGKILL when the zygote dies (a child that cannot have it would outlive the zygote: it
    does not start), and go at once if the zygote is gone already."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except Exception as exc:
        _fail(f"cannot set its parent-death signal: {exc}")
    if os.getppid() != zygote:
        os._exit(PARENT_GONE)


def become_worker(req: dict[str, Any], cfg: dict[str, Any], signals: tuple[dict[int, Any], set[int]]) -> None:
    """In the child: what a fresh worker gets from its spawn (``workers.proctree.spawn``) and from the
    interpreter's start. Any failure ends the child with ``SPAWN_FAILED`` and a line in its log."""
    fds = req["fds"]
    _detach_and_wait(req["zygote"], fds)
    if req.get("mems"):
        _prefer(req["mems"])
    _own_fds(fds, req["progress_fd"] if "progress" in fds else None, req["cwd"])
    _restore_signals(signals)
    os.environ.clear()
    os.environ.update(req["env"])
    look_like(req["argv"], req["env"])  # ps, pgrep -f and /proc/<pid>/environ show the worker's own
    sys.argv = script_argv(cfg["kind"], cfg["entry"], req["argv"])
    if hasattr(sys, "orig_argv"):
        sys.orig_argv = list(req["argv"])
    if sys.path and sys.path[0] != "" and not getattr(sys.flags, "safe_path", False):
        sys.path[0] = path0(cfg["kind"], cfg["entry"], os.getcwd())
    _reseed()
    import importlib

    importlib.invalidate_caches()  # directory listings the zygote cached may be stale by now


def _detach_and_wait(zygote: int, fds: dict[str, int]) -> None:
    """A session of its own, death with the zygote, output to the log; then wait for the go."""
    try:
        os.setsid()
        _die_with_zygote(zygote)
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


def _prefer(nodes: list[int]) -> None:
    """Its memory policy, once placed and bound (``mempolicy``); a refusal is not the worker's end:
    the daemon made the same call itself and logged it."""
    import contextlib

    with contextlib.suppress(Exception):  # (no libc, a kernel without the call)
        prefer_nodes(nodes)()


def _own_fds(fds: dict[str, int], progress_fd: int | None, cwd: str) -> None:
    """Only the fds a spawned worker has (stdin from /dev/null, the progress pipe); its cwd."""
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        keep = 2
        if progress_fd is not None:
            keep = progress_fd
            if fds["progress"] != keep:
                os.dup2(fds["progress"], keep)  # inheritable, as pass_fds makes it
                os.close(fds["progress"])
            os.set_inheritable(keep, True)
        os.closerange(3, keep)
        os.closerange(max(3, keep + 1), os.sysconf("SC_OPEN_MAX"))
        os.chdir(cwd)
    except OSError as exc:
        _fail(exc)


def _restore_signals(signals: tuple[dict[int, Any], set[int]]) -> None:
    """The handlers and mask the interpreter started with, before the imports changed them."""
    handlers, mask = signals
    for sig, handler in handlers.items():
        try:
            if handler is not None and signal.getsignal(sig) != handler:
                signal.signal(sig, handler)
        except (ValueError, OSError, TypeError):
            continue
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


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
