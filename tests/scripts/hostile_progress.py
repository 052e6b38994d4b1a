"""A worker that abuses its progress pipe: junk, over-long lines and a flood at full speed, then
one valid report through $ELASTICD_HEARTBEAT_FILE (the pipe reopened by name), then waits for
$OUT/stop."""

import contextlib
import os
import time

fd = int(os.environ["ELASTICD_PROGRESS_FD"])
junk = [b"step -1\n", b"phase nap\n", b"\xff\xfe\x00\n", b"x" * 100_000, b"\n", b"step 1" * 5000]
for i in range(200_000):
    with contextlib.suppress(BlockingIOError):  # the pipe is full: write on, as a flood would
        os.write(fd, junk[i % len(junk)])
with open(os.environ["ELASTICD_HEARTBEAT_FILE"], "w") as f:  # blocks until the daemon reads
    f.write("\nstep 7\n")
print("flooded, then reported step 7", flush=True)
stop = os.path.join(os.environ["OUT"], "stop")
while not os.path.exists(stop):
    time.sleep(0.1)
