"""What happened in the daemon, as typed records (``records``) on one bus (``bus``).

Control logic publishes a record; the metrics, the cluster's event history and the log line are
subscribers, each matching on the record's type, so a renamed field is a type error, not a
silently dropped metric.
"""
