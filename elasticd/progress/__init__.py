"""Workers' progress and hang detection.

Pure parts (no I/O, no clock: ``now`` is an argument): ``protocol`` (the line protocol a worker
writes), ``tracker`` (per-rank steps, steps/s, stragglers), ``timeouts`` (fixed or learned
timeouts per phase), ``stacks`` (py-spy's output, checked), ``decider`` (which ranks hang, on
what evidence). I/O: ``channel`` (the pipe each worker reports on), ``sampler`` (CPU time and
stack samples), ``watch`` (one attempt's watch: ties them together and dumps stacks on a hang).
"""
