"""The control socket under bad input: every rejection has a stable code, and serving goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import zmq

from elasticd.control.envelope import MAX_MESSAGE_BYTES
from tests.support import DaemonProc


def raw_exchange(d: DaemonProc, payload: bytes, timeout_ms: int = 5000) -> dict[str, Any]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"ipc://{d.socket}")
        sock.send(payload)
        assert sock.poll(timeout_ms), "no reply"
        return dict(json.loads(sock.recv()))
    finally:
        sock.close()
        ctx.term()


BAD = [
    (b"not json", "bad_request", ""),
    (b"[1,2]", "bad_request", ""),
    (b'{"v":1,"cmd":"ping"}', "bad_request", ""),
    (b'{"v":2,"id":"a","cmd":"ping"}', "unsupported_version", "a"),
    (b'{"v":1,"id":"b","cmd":"launch_missiles"}', "unknown_command", "b"),
    (b'{"v":1,"id":"c","cmd":"status","args":{"job":7}}', "invalid_args", "c"),
    (b'{"v":1,"id":"d","cmd":"status","args":{"bogus":1}}', "invalid_args", "d"),
    (b'{"v":1,"id":"e","cmd":"kill","args":{}}', "invalid_args", "e"),
    (b'{"v":1,"id":"f","cmd":"logs","args":{"job":"x","cursor":{"a":"b"}}}', "invalid_args", "f"),
    (b'{"v":1,"id":"g","cmd":"ping","args":[]}', "bad_request", "g"),
    (b'{"v":1,"id":"h","cmd":"ping","extra":1}', "bad_request", "h"),
    (b'{"v":1,"id":"i","cmd":"submit","args":{"entry_kind":"script","entry":"/x.py","cwd":"/",'
     b'"python":"/usr/bin/python3","nproc_per_node":true}}', "invalid_args", "i"),
    (b'{"v":1,"id":"j","cmd":"submit","args":{"entry_kind":"rocket","entry":"x","cwd":"/"}}',
     "invalid_spec", "j"),
    (b"\xff\xfe", "bad_request", ""),
]  # fmt: skip


@pytest.mark.parametrize(("payload", "code", "rid"), BAD)
def test_malformed_requests_get_error_codes(daemon: DaemonProc, payload: bytes, code: str, rid: str) -> None:
    reply = raw_exchange(daemon, payload)
    assert reply["ok"] is False and reply["v"] == 1
    assert reply["error"]["code"] == code, reply
    assert reply["id"] == rid
    assert "Traceback" not in reply["error"]["message"]
    assert daemon.call("ping")["node"] == daemon.node_id


def test_oversized_request_is_capped(daemon: DaemonProc) -> None:
    payload = json.dumps(
        {"v": 1, "id": "big", "cmd": "ping", "args": {"pad": "x" * MAX_MESSAGE_BYTES}}
    ).encode()
    reply = raw_exchange(daemon, payload)
    assert reply["error"]["code"] == "too_large" and reply["id"] == "big"
    assert daemon.call("ping")["node"] == daemon.node_id


def test_ping_reports_the_callers_credentials(daemon: DaemonProc) -> None:
    result = daemon.call("ping")
    assert result["you"]["uid"] == os.geteuid() and result["you"]["gid"] == os.getegid()
    assert result["node"] == daemon.node_id and result["etcd"]


def test_cli_without_daemon_says_so_with_a_hint(tmp_path: Path) -> None:
    env = dict(os.environ, ELASTICD_SOCKET=str(tmp_path / "none.sock"))
    res = subprocess.run(
        [sys.executable, "-m", "elasticctl", "status"], capture_output=True, text=True, env=env, timeout=30
    )
    assert res.returncode == 1
    assert "cannot reach elasticd" in res.stderr and "systemctl start elasticd" in res.stderr
    # A stale socket file with nobody behind it: the CLI gives up after its timeout, same message.
    ctx = zmq.Context()
    stale = ctx.socket(zmq.ROUTER)
    stale.bind(f"ipc://{tmp_path / 'stale.sock'}")
    stale.close(linger=0)
    ctx.term()
    (tmp_path / "stale.sock").touch()
    env["ELASTICD_SOCKET"] = str(tmp_path / "stale.sock")
    res = subprocess.run(
        [sys.executable, "-m", "elasticctl", "--timeout", "1", "ping"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert res.returncode == 1 and "no answer" in res.stderr


def test_cli_usage_errors_exit_2(daemon: DaemonProc) -> None:
    assert daemon.ctl("frobnicate").returncode == 2
    assert daemon.ctl("submit", "--env", "NOEQUALS", "x.py").returncode == 2
