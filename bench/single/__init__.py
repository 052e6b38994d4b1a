"""bench_single's parts: a trial and its stamps (``trial``), the bench's own daemon (``daemon``),
one trial per launcher (``launchers``), and the summary (``report``). ``bench/bench_single.py`` is
the entry point."""
