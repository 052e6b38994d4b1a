"""The zygote's own program: it runs in the *job's* interpreter, as the submitter, never in the daemon.

Stdlib only, and never imported there by elasticd: the daemon reads this file's source, after
the program's other parts (``warm.spawn.BOOT_PARTS``: ``shared``, ``child``, the part a forked
child runs, ``stamps``, ...), from its own package and hands them over a pipe
(``proctree.helper.Program.loader``), because the job's python (Debian's ``/usr/bin/python3``,
say) need not be able to import elasticd, nor enter the daemon's venv. The loader runs the parts
in one namespace, so the earlier parts' names are globals here.

What it does, once per zygote (a job's on a node, and the next identical job's when the daemon
parked it between the two: ``warm.pool``):
1. read its configuration (the entry point, ``--preload`` modules) from the control socket;
2. set ``sys.path[0]`` as the worker's interpreter will, import torch (if there is one) and the
   preload modules, and check it is fit to fork: exactly one OS thread, CUDA not initialised;
3. record what each file behind ``sys.modules`` (and the interpreter) looked like (the
   ``stamps`` part): a worker forked later runs that code, so a job may adopt this zygote only
   while none of them changed;
4. serve requests (one ``SOCK_SEQPACKET`` message each): ``fork`` (the rank's fds attached with
   ``SCM_RIGHTS``) reports the child's pid, ``store`` forks the job's store host the same way
   (``storehost``), ``check`` re-reads the recorded files' stamps (as the
   submitter: the daemon never opens a user's files) and says whether they are unchanged; and
   reap its children, reporting ``exit`` with the raw wait status.

Messages to the daemon are single JSON objects (``ready``, ``unavailable``, ``forked``,
``fork_failed``, ``exit``, ``checked``); the daemon treats every one of them as untrusted
(``wire``).
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
from typing import TYPE_CHECKING, Any

if __name__ != "__elasticd_zygote__":  # the daemon's tests and mypy; in the zygote, a global already
    from elasticd.workers.zygote_program.child import become_worker, path0, run_entry
    from elasticd.workers.zygote_program.mempolicy import MAX_NODE
    from elasticd.workers.zygote_program.reach import cannot_reach_torch
    from elasticd.workers.zygote_program.stamps import changed, module_files, stamps
    from elasticd.workers.zygote_program.storehost import BadStoreRequest, parse_store_op, serve_store

    if TYPE_CHECKING:
        from elasticd.workers.zygote_program.stamps import Stamp

MAX_REQUEST = 4 << 20  # a fork request: argv and env of one rank
MAX_FDS = 8
FD_NAMES = ("log", "progress", "go")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


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
    "progress_fd": the number the worker's env names for the progress pipe, or null, "mems": the
    NUMA nodes its memory prefers, or null}``."""
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
    mems = req.get("mems")
    if mems is not None and (
        not isinstance(mems, list) or not mems or not all(type(n) is int and 0 <= n < MAX_NODE for n in mems)
    ):
        raise BadRequest(f"mems must be a non-empty list of NUMA nodes 0..{MAX_NODE - 1}")
    return {
        "op": "fork",
        "id": rid,
        "argv": argv,
        "env": env,
        "cwd": cwd,
        "fds": names,
        "progress_fd": target,
        "mems": mems,
    }


def parse_op(data: bytes, nfds: int) -> dict[str, Any]:
    """A request: a fork (``parse_request``), a store host's fork (``storehost.parse_store_op``)
    or ``{"op": "check", "id"}`` (no fds)."""
    try:
        req = json.loads(data)
    except ValueError as exc:
        raise BadRequest(f"request is not JSON: {exc}") from None
    if isinstance(req, dict) and req.get("op") == "check":
        rid = req.get("id")
        if type(rid) is not int or rid < 0 or nfds:
            raise BadRequest("a check request has a non-negative integer id and no fds")
        return {"op": "check", "id": rid}
    if isinstance(req, dict) and req.get("op") == "store":
        try:
            return parse_store_op(req, nfds)
        except BadStoreRequest as exc:
            raise BadRequest(str(exc)) from None
    return parse_request(data, nfds)


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


# What torch imports on a training script's first steps rather than at ``import torch``, warmed
# here when torch is there, best effort (a torch without it forks as well): an optimizer's
# constructor imports ``torch._dynamo`` (about 1 s on this machine's CPU), which every restarted
# worker would pay again. It starts no thread and touches no device (``gpu_check.sh`` checks that
# the warm parent maps no CUDA library).
WARM_AFTER_TORCH = ("torch._dynamo",)


def _preload(cfg: dict[str, Any]) -> str | None:
    """Import torch (when the interpreter has it), what torch loads on first use and the preload
    modules; a reason on failure."""
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
        if mod == "torch":
            for extra in WARM_AFTER_TORCH:
                try:
                    importlib.import_module(extra)
                except Exception:  # best effort: the worker imports it itself
                    continue
    return None


def _imported(cfg: dict[str, Any]) -> str | None:
    """``_preload`` with the cyclic collector off: torch's import makes ~170,000 objects that
    live as long as the process and almost no garbage (its ~400 collections find ~7,000 objects),
    so collecting during it is ~10 % of a cold start for nothing. The collector is as the
    interpreter had it before anything else runs; what little garbage the imports left is
    frozen with the rest (``gc.freeze`` below), a few hundred kB shared by every worker."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _preload(cfg)
    finally:
        if collecting:
            gc.enable()


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
    started, since_ns = time.monotonic(), time.time_ns()
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
    local = cannot_reach_torch(cfg["kind"], cfg["entry"], path0(cfg["kind"], cfg["entry"], os.getcwd()))
    cfg["torch"] = cfg["torch"] and local is None  # (``reach``: its files are stamped)
    reason = _imported(cfg)
    if reason is None and _threads() != 1:
        reason = f"{_threads()} threads after the imports (fork needs 1; OMP_NUM_THREADS>1 starts OpenBLAS's)"
    if reason is None and _cuda_initialized():
        reason = "CUDA was initialised by the imports"
    if reason is not None:
        _send(ctl, ev="unavailable", reason=reason)
        return
    files = stamps(module_files() + (local or []), since_ns)
    _send(
        ctl,
        ev="ready",
        pid=os.getpid(),
        import_s=round(time.monotonic() - started, 4),
        torch="torch" in sys.modules,
        preloaded=[m for m in cfg["preload"] if m in sys.modules],
        files=len(files),
    )
    # What is imported now stays: keep the collector off it, so a child's collections (and its
    # interpreter's finalisation) neither walk it nor copy its pages (the gc module's advice).
    gc.freeze()
    req = serve(ctl, files)  # returns in a forked child only
    if req["op"] == "store":
        serve_store(req)  # never returns
    become_worker(req, cfg, signals)
    run_entry(cfg)


def serve(ctl: socket.socket, files: dict[str, Stamp]) -> dict[str, Any]:
    """Serve requests and reap; returns only in a child (its request, with ``fds`` open)."""
    children: dict[int, int] = {}  # pid -> pidfd
    me = os.getpid()
    while True:
        ready, _, _ = select.select([ctl.fileno(), *children.values()], [], [])
        _reap(ctl, children, ready)
        if ctl.fileno() not in ready:
            continue
        got = _fork_request(ctl, files)
        if got is None:
            continue
        req, fds = got
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


def _reap(ctl: socket.socket, children: dict[int, int], ready: list[int]) -> None:
    """Wait for the children whose pidfd is ``ready`` and tell the daemon how each ended."""
    for pid, pidfd in list(children.items()):
        if pidfd in ready:
            _, status = os.waitpid(pid, 0)
            os.close(pidfd)
            del children[pid]
            _send(ctl, ev="exit", pid=pid, status=status)


def _fork_request(ctl: socket.socket, files: dict[str, Stamp]) -> tuple[dict[str, Any], list[int]] | None:
    """The next request to fork, with the fds it carries; None when it was answered here (a
    check, a bad request). Exits when the daemon is gone."""
    try:
        data, fds = _recv(ctl)
    except BadRequest as exc:
        _send(ctl, ev="fork_failed", id=-1, error=str(exc))
        return None
    if not data:  # the daemon is gone: our children die with us (their parent-death signal)
        os._exit(0)
    try:
        req = parse_op(data, len(fds))
    except BadRequest as exc:
        for fd in fds:
            os.close(fd)
        _send(ctl, ev="fork_failed", id=-1, error=str(exc))
        return None
    if req["op"] == "check":
        stale = changed(files)
        _send(ctl, ev="checked", id=req["id"], fresh=stale is None, files=len(files), changed=stale or "")
        return None
    return req, fds


if __name__ == "__elasticd_zygote__":
    main(globals()["CTL_FD"])  # given by the loader
