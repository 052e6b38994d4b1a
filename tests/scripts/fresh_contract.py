"""What a worker finds when it starts, before it imports anything itself: the same whether it was
exec'd afresh (cold) or forked from the job's zygote (warm). Writes $OUT/fresh.<round>.<rank>.json,
then exits with $EXIT_ROUND_<round> (default 0)."""

import sys

preloaded = sorted(m for m in ("torch", "numpy") if m in sys.modules)

import ctypes  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import signal  # noqa: E402

threads = len(os.listdir("/proc/self/task"))
umask = os.umask(0)
os.umask(umask)
progress = os.environ.get("ELASTICD_PROGRESS_FD")


def fds() -> dict[str, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own fd, closed by now
            continue
        out["progress" if fd == progress else fd] = "pipe" if target.startswith("pipe:") else target
    return out


def disposition(sig: int) -> str:
    handler = signal.getsignal(sig)
    if handler is None:
        return "C"
    return str(getattr(handler, "name", None) or getattr(handler, "__name__", repr(handler)))


with open("/proc/self/cgroup") as f:
    cgroups = f.read()
with open("/proc/self/cmdline", "rb") as raw:
    cmdline = raw.read()
with open("/proc/self/environ", "rb") as raw:
    environ = raw.read()
pdeathsig = ctypes.c_int(0)
ctypes.CDLL(None).prctl(2, ctypes.byref(pdeathsig), 0, 0, 0)  # PR_GET_PDEATHSIG
record = {
    "preloaded": preloaded,
    "main_name": __name__,
    "main_file": __file__,
    "main_spec": repr(__spec__),
    "main_loader": type(globals().get("__loader__")).__name__,  # typeshed does not declare __loader__
    "main_keys": sorted(k for k in globals() if k.startswith("__")),
    "argv": sys.argv,
    "orig_argv": getattr(sys, "orig_argv", None),
    "executable": sys.executable,
    "flags": repr(sys.flags),
    "env": dict(os.environ),
    "cmdline": cmdline.decode().split("\0"),
    "environ": dict(e.split("=", 1) for e in environ.decode().split("\0") if e),
    "path": sys.path,
    "cwd": os.getcwd(),
    "ids": [os.getresuid(), os.getresgid(), sorted(os.getgroups())],
    "rlimits": {
        n: resource.getrlimit(getattr(resource, n)) for n in sorted(dir(resource)) if n.startswith("RLIMIT_")
    },
    "umask": umask,
    "fds": fds(),
    "signals": {
        signal.Signals(s).name: disposition(s) for s in sorted(signal.valid_signals()) if s < signal.SIGRTMIN
    },
    "sigmask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "threads": threads,
    "session_leader": os.getsid(0) == os.getpid() == os.getpgid(0),
    "pdeathsig": pdeathsig.value,
    "stdin": os.readlink("/proc/self/fd/0"),
    "cgroup": [line for line in cgroups.splitlines() if line.startswith("0::")],
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "random": random.random(),
    "gc": [gc.isenabled(), gc.get_threshold()],
}
try:
    import torch
except ImportError:
    pass
else:
    record["cuda_initialized"] = torch.cuda.is_initialized()
    record["torch_random"] = torch.rand(1).item()
    record["torch_seed"] = torch.initial_seed()
rnd, rank = os.environ["ELASTICD_ROUND"], os.environ["RANK"]
path = os.path.join(os.environ["OUT"], f"fresh.{rnd}.{rank}.json")
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.replace(path + ".tmp", path)
sys.exit(int(os.environ.get(f"EXIT_ROUND_{rnd}", "0")))
