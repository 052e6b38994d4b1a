"""bench_rdzv_scale's parts: where each node's bytes and requests are counted (``meter``), one
participant (``node``), the processes that play them (``participants``), another daemon's scan
beside the round (``scan``), etcd's own rates and CPU (``etcdrates``), a round of each side
(``rounds``, ``torchside``), and the records and tables (``report``).
``bench/bench_rdzv_scale.py`` is the entry point."""
