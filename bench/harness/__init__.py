"""What several benches share: the processes they start and how they clean them up (``procs``),
where the code and tools are (``paths``), the daemon's JSON log on a terminal (``daemonlog``), and
what a run records besides its trials (``runinfo``)."""
