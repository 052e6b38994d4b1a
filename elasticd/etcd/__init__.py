"""etcd v3: the KV seam, its HTTP/JSON client and in-memory fake, the key layout, the embedded server."""
