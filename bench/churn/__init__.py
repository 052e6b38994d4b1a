"""bench_node_churn's parts: the light nodes and the observer daemons (``participants``), etcd's
own counters (``etcdstats``), the phases and the cluster at rest (``phases``), and the records and
tables (``report``). ``bench/bench_node_churn.py`` is the entry point."""
