"""bench_goodput's parts: the figures from a progress log and their table (``figures``), the two
launchers and the calibration (``launchers``), and the worker kills (``faults``).
``bench/bench_goodput.py`` is the entry point."""
