"""The optional Prometheus endpoint (``metrics_address``): counters fed by the typed records of
what happened (``elasticd.happenings``), gauges read from the daemon's state at scrape time."""
