#!/usr/bin/env bash
# The main job, from a fresh clone: set up .venv, start elasticd with its private embedded etcd,
# submit the 2-process gloo DDP example with --follow until it succeeds, then stop the daemon.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$repo/packaging/dev-env.sh" torch
bin="$repo/.venv/bin"

work="$(mktemp -d -t elasticd-demo.XXXXXX)"
export ELASTICD_SOCKET="$work/control.sock"
# The demo submits as whoever runs it; as root (CI, a container) that needs root jobs allowed,
# which a real deployment leaves off (see SECURITY.md).
root_jobs=()
[ "$(id -u)" -eq 0 ] && root_jobs=(--allow-root-jobs)
"$bin/elasticd" --state-dir "$work/state" --log-dir "$work/logs" --node-id demo --stop-grace 5 \
    "${root_jobs[@]}" 2> "$work/elasticd.log" &
daemon=$!
cleanup() {
    kill -TERM "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
    echo "elasticd stopped; its log is $work/elasticd.log" >&2
}
trap cleanup EXIT

for _ in $(seq 100); do
    "$bin/elasticctl" ping --timeout 1 >/dev/null 2>&1 && break
    kill -0 "$daemon" 2>/dev/null || { cat "$work/elasticd.log" >&2; exit 1; }
    sleep 0.2
done
"$bin/elasticctl" ping
"$bin/elasticctl" nodes

# As a user would: the job runs with the `python` on PATH (here, the venv's), in this directory.
export PATH="$bin:$PATH"
cd "$repo"
# It checkpoints after every step: memory snapshots are on by default (`elasticctl nodes` shows the
# bound the daemon derived from this host), so a crash would redo at most the step in flight.
"$bin/elasticctl" submit --nproc-per-node 2 --max-restarts 1 --follow examples/ddp_minimal.py -- --steps 20 \
    --checkpoint "$work/ddp_minimal.pt"
