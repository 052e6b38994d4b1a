"""Elastic rendezvous on etcd v3: rounds of per-node join keys, a result written once per round.

``model`` holds the records (each field checked by ``fieldchecks``), ``jobread`` a job as one
read found it (one frozen type per shape of read, parsed by ``jobparse``), ``decider`` the pure
rules (when a round closes, who gets which rank, whether an event bumps the round and spends the
restart budget), ``storeread`` and ``store`` the etcd I/O (the reads, and the writes over them).
"""
