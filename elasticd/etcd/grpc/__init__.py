"""etcd over grpc (``etcd_client = grpc``): the KV seam through the ``etcd3`` package's v3 API.

``proto``: etcd3's generated code loaded, and what answers and errors mean; ``client``: the KV
seam on channels of our own; ``watch``: one watch stream and its reader thread.

Why a second backend beside the JSON gateway (``etcd.client``, the default): etcd's gateway
cannot map a client certificate's CN to an etcd user (etcd-io/etcd#10392), which is how most
production clusters (Kubernetes' among them) identify clients, and some clusters turn the gateway
off. Over grpc, a client certificate with a CN *is* the etcd user, no password needed. The price
is the idle footprint (``bench/bench_footprint.py``: grpc's event-engine threads, ~30 MB more
RSS), which is why it is not the default.

What it uses of ``etcd3`` (0.12): the generated v3 API (``etcd3.etcdrpc``: messages and stubs) on
a channel of our own, so that every request can say what the seam needs (``count_only``,
``limit``, ``min_mod_revision`` and sorts inside one read-only transaction) and so that UNIX
endpoints (the embedded etcd) and several endpoints with failover work as with the gateway client.
etcd3's generated code predates protobuf 4 and needs protobuf's pure-Python implementation, a
process-wide setting read when protobuf is first imported: ``_load`` sets it for that import only,
and only here, so the gateway path and every process the daemon starts never see it.

Errors map as the gateway's do: a grpc status is the same v3 status code the gateway reports, so
``gateway.status_error`` names the ``Failure`` and ``client.refused`` our error.
"""
