"""The keeper's process: its sockets and its loop (standard library only; the last part of the
keeper's program, after ``protocol``, ``replies``, ``requests``, ``replica``, ``filing``, ``keeper`` and
``peers``; see ``keeper``)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import stat
import struct
import sys
import tempfile
import time

if __name__ != "__elasticd_keeper__":
    from elasticd.workers.snapshot_program import peers
    from elasticd.workers.snapshot_program.filing import Behind
    from elasticd.workers.snapshot_program.keeper import Keeper
    from elasticd.workers.snapshot_program.protocol import (
        MAX_CONTROL,
        MAX_MESSAGE,
        BadMessage,
        Control,
        KeeperReady,
        KeeperUnavailable,
        Order,
        decode_config,
        decode_order,
        encode_control,
    )
    from elasticd.workers.snapshot_program.replies import Refused, Reply
    from elasticd.workers.snapshot_program.requests import encode_message, parse_request

    start_peers = peers.start
else:
    start_peers = globals()["start"]  # peers' ``start``: the parts share one namespace

MAX_CLIENTS = 512  # a node's ranks, and a few more


def _send(conn: socket.socket, reply: Reply, fd: int | None) -> None:
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))] if fd is not None else []
    try:
        conn.sendmsg([encode_message(reply)], anc)
    finally:
        if fd is not None:
            os.close(fd)


def _serve_one(keeper: Keeper, conn: socket.socket) -> bool:
    """One request from ``conn``; False when the connection is done."""
    try:
        data, _, flags, _ = conn.recvmsg(MAX_MESSAGE + 1)
    except (BlockingIOError, InterruptedError):
        return True
    except OSError:
        return False
    if not data:
        return False
    try:
        if flags & socket.MSG_TRUNC:
            raise BadMessage("message too long")
        reply, fd = keeper.handle(parse_request(data))
    except BadMessage as exc:
        reply, fd = Refused(str(exc)), None
    except OSError as exc:  # a segment the kernel would not give (memory): this snapshot fails
        reply, fd = Refused(f"cannot make a segment: {exc.strerror or exc}"), None
    except Exception as exc:  # a bug here must cost one request, never the snapshots held
        reply, fd = Refused(f"keeper: {type(exc).__name__}: {exc}"[:300]), None
    try:
        _send(conn, reply, fd)
    except OSError:
        return False
    return True


def _accept(listener: socket.socket, clients: dict[int, socket.socket]) -> None:
    try:
        conn, _ = listener.accept()
    except OSError:
        return
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    if uid != os.getuid() or len(clients) >= MAX_CLIENTS:
        conn.close()
        return
    clients[conn.fileno()] = conn


def _tell(ctl: socket.socket, msg: Control) -> None:
    """One report to the daemon; dropped when it does not read (never blocks the loop)."""
    with contextlib.suppress(OSError):
        ctl.send(encode_control(msg), socket.MSG_DONTWAIT)


def _control(ctl: socket.socket, behind: Behind) -> bool:
    """The daemon's word: ``Order.PERSIST`` (the workers here stopped), or its end closed (the
    job ended here: the last writes too). False once closed."""
    try:
        data = ctl.recv(MAX_CONTROL)
    except OSError:
        data = b""
    if not data:
        behind.start()
        return False
    if decode_order(data) is Order.PERSIST:
        behind.start()
    return True


def serve(ctl: socket.socket, listener: socket.socket, keeper: Keeper) -> None:
    """Until the daemon closes ``ctl`` and the writes it asked for are done."""
    clients: dict[int, socket.socket] = {}
    behind = Behind(keeper, lambda report: _tell(ctl, report))
    live = True
    while live or behind.children:
        watched = [listener.fileno(), *clients, *behind.fds(), *([ctl.fileno()] if live else [])]
        ready, _, _ = select.select(watched, [], [], behind.timeout())
        if live and ctl.fileno() in ready:
            live = _control(ctl, behind)
        behind.read(ready)
        behind.poll()
        if listener.fileno() in ready:
            _accept(listener, clients)
        for fd in ready:
            conn = clients.get(fd)
            if conn is not None and not _serve_one(keeper, conn):
                del clients[fd]
                conn.close()


PREFIX = "elasticd-snapshots-"
STALE_S = 60.0  # a directory younger than this may be a keeper's that has not bound its socket yet


def sweep_stale(base: str) -> int:
    """Remove our uid's keeper directories in ``base`` that no keeper listens in any more (a keeper
    killed with SIGKILL leaves its directory and socket behind). Our own files only, as ourselves:
    the daemon never touches these. Returns how many went."""
    gone = 0
    try:
        names = sorted(n for n in os.listdir(base) if n.startswith(PREFIX))[:256]
    except OSError:
        return 0
    for name in names:
        where = os.path.join(base, name)
        try:
            st = os.lstat(where)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or time.time() - st.st_mtime < STALE_S:
            continue
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(os.path.join(where, "sock"))
            continue  # a live keeper
        except (ConnectionRefusedError, FileNotFoundError):
            pass
        except OSError:
            continue
        finally:
            probe.close()
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(where, "sock"))
        with contextlib.suppress(OSError):
            os.rmdir(where)
            gone += 1
    return gone


def _replication(address: str) -> socket.socket | None:
    """The TCP listener other keepers and the job's workers reach (None: replication is off)."""
    if not address:
        return None
    try:
        sock = socket.create_server(
            (address, 0), family=socket.AF_INET6 if ":" in address else socket.AF_INET
        )
    except OSError:
        return None
    return sock


def main(ctl_fd: int) -> None:
    ctl = socket.socket(fileno=ctl_fd)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        config = decode_config(ctl.recv(MAX_CONTROL))
    except BadMessage:
        ctl.send(encode_control(KeeperUnavailable("bad configuration")))
        return
    bound, address = config.bound, config.address
    sweep_stale(tempfile.gettempdir())
    where = tempfile.mkdtemp(prefix=PREFIX)  # 0700, ours, a fresh name
    path = os.path.join(where, "sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    tcp = _replication(address)
    keeper = Keeper(bound, address if tcp else "", tcp.getsockname()[1] if tcp else 0)
    try:
        listener.bind(path)
        listener.listen(64)
        if tcp is not None:
            start_peers(keeper, tcp)
        ctl.send(encode_control(KeeperReady(os.getpid(), path, keeper.port)))
        serve(ctl, listener, keeper)
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(where)


if __name__ == "__elasticd_keeper__":
    main(globals()["CTL_FD"])  # given by the loader
