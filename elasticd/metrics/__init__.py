"""The optional Prometheus endpoint (``metrics_address``): counters fed by the event bus, gauges
read from the daemon's state at scrape time."""
