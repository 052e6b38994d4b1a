"""Elastic rendezvous on etcd v3: rounds of per-node join keys, a result written once per round.

``model`` holds the records, ``decider`` the pure rules (when a round closes, who gets which rank,
whether an event bumps the round and spends the restart budget), ``store`` the etcd I/O.
"""
