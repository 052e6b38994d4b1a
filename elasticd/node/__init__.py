"""This host: its GPU inventory, how devices are shared between jobs, and its lease in etcd."""
