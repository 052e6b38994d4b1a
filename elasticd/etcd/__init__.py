"""etcd v3: the client (the only importer of ``etcd3``), the key layout, and the embedded server."""
