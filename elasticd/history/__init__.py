"""The cluster's event history: what happened to jobs and nodes, kept in etcd with a bounded size."""
