"""etcd3's generated v3 API loaded for this backend only, and what its answers and errors mean."""

from __future__ import annotations

import importlib
import os
import warnings
from dataclasses import dataclass
from typing import Any

from elasticd.errors import ConfigError
from elasticd.etcd import gateway as gw
from elasticd.etcd.gateway import Failure, GatewayError
from elasticd.etcd.kv import prefix_end
from elasticd.etcd.transport import Endpoint
from elasticd.etcd.types import Found, KeyValue, Query

PB_ENV = "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"
# grpc's fork support runs handlers around every fork; while another thread is inside grpc (a
# watch always is), a child forked to exec a worker, a keeper or py-spy can die of SIGABRT in
# them before its exec (grpcio 1.85: a few in a hundred). The daemon never uses grpc in a child
# it forks (each one execs at once), so the support is off, for the daemon's whole life: grpc
# reads the setting when it starts, not at each fork.
FORK_ENV = "GRPC_ENABLE_FORK_SUPPORT"
DB_SIZE_IN_USE_FIELD = 9  # StatusResponse.dbSizeInUse (etcd >= 3.4), newer than etcd3's protos


def load() -> tuple[Any, Any]:
    """``grpc`` and ``etcd3.etcdrpc``, with protobuf's pure-Python implementation for this import
    (the environment is as it was afterwards: processes we start do not inherit the setting), and
    grpc's fork support off (``FORK_ENV``)."""
    os.environ[FORK_ENV] = "false"
    had = os.environ.get(PB_ENV)
    os.environ[PB_ENV] = "python"
    try:
        with warnings.catch_warnings():  # etcd3's generated code uses descriptor calls protobuf deprecates
            warnings.simplefilter("ignore", DeprecationWarning)
            grpc = importlib.import_module("grpc")
            rpc = importlib.import_module("etcd3.etcdrpc")
    except ImportError as exc:
        raise ConfigError(
            f"etcd_client = grpc needs the grpc extra (pip install 'elasticd[grpc]'): {exc}"
        ) from exc
    except TypeError as exc:  # protobuf was imported before, with its C implementation
        raise ConfigError(
            f"etcd_client = grpc: etcd3's protobuf code cannot load in this process: {exc}"
        ) from exc
    finally:
        if had is None:
            os.environ.pop(PB_ENV, None)
        else:
            os.environ[PB_ENV] = had
    return grpc, rpc


def status_of(grpc_error: Any) -> GatewayError:
    """A failed call's grpc status, as the gateway's mapping names it."""
    try:
        code, details = grpc_error.code().value[0], grpc_error.details()
    except Exception:  # not a call's error (a channel that never connected says less)
        return GatewayError(Failure.UNREACHABLE, str(grpc_error) or type(grpc_error).__name__)
    return gw.status_error(code, details)


@dataclass
class Channel:
    """One endpoint's channel and the stubs on it."""

    endpoint: Endpoint
    channel: Any
    kv: Any
    lease: Any
    watch: Any
    maintenance: Any
    auth: Any


def key_value(kv: Any) -> KeyValue:
    return KeyValue(kv.key.decode("utf-8", "replace"), bytes(kv.value), int(kv.create_revision),
                    int(kv.mod_revision), int(kv.lease))  # fmt: skip


def found(r: Any, revision: int = 0) -> Found:
    return Found([key_value(kv) for kv in r.kvs], int(r.count), revision)


def in_use(status: Any) -> int:
    """``dbSizeInUse``, which etcd >= 3.4 sends and etcd3's older protos keep as an unknown field
    (0, "not said", when it cannot be read)."""
    try:
        unknown = importlib.import_module("google.protobuf.unknown_fields")
        for f in unknown.UnknownFieldSet(status):
            if f.field_number == DB_SIZE_IN_USE_FIELD and isinstance(f.data, int):
                return max(0, f.data)
    except Exception:  # an older protobuf without the module: the member's size in use is not said
        pass
    return 0


def range_request(rpc: Any, q: Query, revision: int = 0) -> Any:
    """A RangeRequest; ``revision``: as of that store revision (0: the newest), which a member
    that has applied it serves without a consensus round."""
    request = rpc.RangeRequest(key=_b(q.key))
    if q.prefix:
        request.range_end = _b(prefix_end(q.key))
    elif q.end is not None:
        request.range_end = _b(q.end)
    if q.oldest_only:
        request.sort_order, request.sort_target, request.limit = (
            rpc.RangeRequest.ASCEND, rpc.RangeRequest.CREATE, 1
        )  # fmt: skip
    elif q.first_only:
        request.limit = 1
    elif q.limit:
        request.limit = q.limit
    request.count_only = q.count_only
    request.min_mod_revision = q.min_mod_revision
    request.serializable = q.serializable or bool(revision)
    request.revision = revision
    return request


def _b(s: str) -> bytes:
    return s.encode()
