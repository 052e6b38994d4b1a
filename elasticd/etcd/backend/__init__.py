"""Which client the daemon talks to etcd with (the setting ``etcd_client``).

``gateway`` (the default): ``etcd.client``, etcd's JSON gateway over the standard library's HTTP
client, the smaller idle footprint. ``grpc``: ``etcd.grpc`` over the ``etcd3`` package
(``pip install 'elasticd[grpc]'``), for clusters that identify clients by their certificate's CN
or run with the gateway off. The grpc package is imported only when it is picked, so the
gateway path never loads grpc or protobuf. (A package of its own: it sits above both clients, and
``etcd.grpc`` is built on ``etcd``'s modules.)
"""

from __future__ import annotations

from collections.abc import Sequence

from elasticd.etcd.client import EtcdClient
from elasticd.etcd.kv import Backend
from elasticd.etcd.types import EtcdAuth


def connect(
    kind: str, endpoints: Sequence[str], auth: EtcdAuth | None = None, timeout_s: float = 5.0
) -> Backend:
    """A client of ``kind`` (one of ``kv.CLIENTS``) for ``endpoints``; raises ``ConfigError`` when
    the grpc extra is missing."""
    if kind == "grpc":
        from elasticd.etcd.grpc.client import GrpcEtcdClient

        return GrpcEtcdClient(endpoints, auth, timeout_s)
    return EtcdClient(endpoints, auth, timeout_s)
