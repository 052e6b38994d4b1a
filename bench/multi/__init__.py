"""bench_multi's parts: what the workers leave behind (``stamps``), a trial (``trial``), the
processes it finds and measures (``procs``), one elasticd "node" (``daemon``), the bench's etcd
and temp dir (``cluster``), the loss and drain timings both launchers share (``scenarios``), each
launcher's trials (``elasticd_trials``, ``torchrun_trials``), and the summary (``report``).
``bench/bench_multi.py`` is the entry point."""
