"""bench_footprint's parts: the etcd and daemon it measures (``setup``), CPU and memory samples
(``measure``), the control RPC load (``rpc``), and the table (``report``). ``bench/bench_footprint.py``
is the entry point."""
