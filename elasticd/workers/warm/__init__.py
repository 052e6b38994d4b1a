"""Warm workers, the daemon's side: a job's zygote (a warm parent that imported torch once) forks its
workers, and a node-wide pool keeps healthy zygotes for the next identical job.

``spawn`` says what a zygote is made of, ``process`` starts and holds its process, ``zygote``
supervises it, ``messages`` parses what it says, ``children`` keeps the workers it forked,
``spawner`` is the ``Spawner`` a group forks through;
``pool_decider`` decides, purely, and ``pool`` carries out. The program the zygote runs is
``workers.zygote_program``.
"""
