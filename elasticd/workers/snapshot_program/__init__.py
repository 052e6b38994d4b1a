"""What runs in a job's own processes for memory snapshots: the keeper (``keeper``, stdlib only, in
the job's interpreter as the submitter) and the workers' side of it (``client``, ``frame``), over
one protocol (``protocol``). The daemon starts and stops the keeper (``workers.warm.snapshotkeeper``) and
never opens a snapshot."""
