"""A hostile local client: 10,000 random and malformed control messages, every one answered, RSS bounded."""

from __future__ import annotations

import json
import random
from typing import Any

import psutil
import pytest
import zmq

from elasticd.control.address import endpoint
from elasticd.control.commands import REGISTRY
from tests.support import DaemonProc

pytestmark = pytest.mark.slow

MESSAGES = 10_000
WARMUP = 1_000
RSS_GROWTH_LIMIT = 48 << 20
REPLY_TIMEOUT_MS = 10_000


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 4 else 5)
    match kind:
        case 0:
            return None
        case 1:
            return rng.choice([True, False])
        case 2:
            return rng.choice([0, -1, 1, 2**31, -(2**63), 2**64, rng.randrange(-1000, 1000)])
        case 3:
            return rng.choice([0.5, -1e308, 1e308, float(rng.random())])
        case 4:
            return "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(0, 40)))
        case 5:
            return [_random_json(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
        case _:
            keys = ["job", "node", "entry", "cwd", "args", "env", "rank", "cursor", "grace_s", "x"]
            return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randrange(0, 6))}


def _message(rng: random.Random, i: int) -> list[bytes]:
    """One hostile request as ZeroMQ frames; most carry an id, many do not."""
    commands = [*REGISTRY, "", "nope", "submit\x00", "../kill", "KILL"]
    envelope: dict[str, Any] = {"v": 1, "id": f"m{i}", "cmd": rng.choice(commands), "args": {}}
    match rng.randrange(12):
        case 0:
            return [rng.randbytes(rng.randrange(0, 2048))]
        case 1:
            return [json.dumps(_random_json(rng)).encode()]
        case 2:
            envelope[rng.choice(["v", "id", "cmd", "args"])] = _random_json(rng)
        case 3:
            del envelope[rng.choice(["v", "id", "cmd"])]
        case 4:
            envelope["extra"] = _random_json(rng)
        case 5:
            return [b"[" * rng.randrange(1000, 200_000)]
        case 6:
            return [b'{"v":1,"id":"m' + str(i).encode() + b'","cmd":"status","args":{"job":"\xff\xfe"}}']
        case 7:
            return [rng.randbytes(8), json.dumps(envelope).encode()]  # an extra frame first
        case 8 if i % 50 == 0:
            return [b'{"v":1,"id":"big","cmd":"ping","args":{"x":"' + b"a" * (2 << 20) + b'"}}']
        case _:
            envelope["args"] = (
                _random_json(rng)
                if rng.random() < 0.3
                else {
                    k: _random_json(rng)
                    for k in rng.sample(["job", "node", "rank", "cursor", "entry", "x"], 2)
                }
            )
    return [json.dumps(envelope).encode()]


def test_ten_thousand_hostile_messages_are_all_answered(daemon: DaemonProc) -> None:
    rng = random.Random(20261123)
    proc = psutil.Process(daemon.proc.pid)  # type: ignore[union-attr]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint(daemon.socket))
    rss_after_warmup = 0
    codes: dict[str, int] = {}
    try:
        for i in range(MESSAGES):
            sock.send_multipart(_message(rng, i))
            assert sock.poll(REPLY_TIMEOUT_MS), f"message {i} got no reply"
            reply = json.loads(sock.recv_multipart()[-1])
            assert reply["v"] == 1 and isinstance(reply["ok"], bool)
            if not reply["ok"]:
                code = reply["error"]["code"]
                assert code != "internal", reply
                codes[code] = codes.get(code, 0) + 1
            if i == WARMUP:
                rss_after_warmup = proc.memory_info().rss
    finally:
        sock.close()
        ctx.term()
    growth = proc.memory_info().rss - rss_after_warmup
    assert growth < RSS_GROWTH_LIMIT, f"RSS grew {growth >> 20} MiB over {MESSAGES - WARMUP} messages"
    assert {"bad_request", "invalid_args", "unknown_command", "too_large"} <= set(codes), codes
    assert daemon.call("ping")["node"] == daemon.node_id
