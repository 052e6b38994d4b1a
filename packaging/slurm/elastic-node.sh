#!/usr/bin/env bash
# One node's part of an allocation-private elasticd (packaging/slurm/elastic-allocation.sbatch,
# docs/slurm.md). Run by srun, once per node:
#
#   elastic-node.sh daemon      this node's elasticd, in the foreground, against the allocation's etcd
#   elastic-node.sh run ARGS    wait for this node's elasticd, then `exec elasticrun ARGS` through it
#
# Everything of the daemon is private to this user and this allocation: its socket (0600), state
# and job logs live in a 0700 directory under $ELASTIC_NODE_DIR (default $TMPDIR/elasticd-<job>,
# node-local), so it needs no root and never meets a site-wide elasticd. Its own log goes to
# $ELASTIC_LOG_DIR/<node>/elasticd.log when that is set (the sbatch script sets it).
#
# Inputs (exported by the sbatch script): ELASTIC_ETCD_ENDPOINT and ELASTIC_TLS_DIR (ca.pem,
# client.pem, client.key); optional: ELASTIC_NODE_ADDRESS (the address peers' workers reach this
# node at; default: the source address of the route to the etcd host), ELASTIC_SLOTS (default:
# $SLURM_CPUS_ON_NODE), ELASTIC_DAEMON_WAIT (seconds `run` waits for the daemon, default 120).
set -euo pipefail

die() {
	echo "elastic-node.sh: $*" >&2
	exit 2
}

node=${SLURMD_NODENAME:?run me under srun, which sets SLURMD_NODENAME}
job=${SLURM_JOB_ID:?run me inside a Slurm allocation}
base=${ELASTIC_NODE_DIR:-${TMPDIR:-/tmp}/elasticd-$job}
dir=$base/$node
export ELASTICD_SOCKET=$dir/ctl.sock
# A UNIX socket's path holds at most 107 bytes: a deep $TMPDIR would leave a daemon that never binds.
((${#ELASTICD_SOCKET} <= 107)) ||
	die "the control socket $ELASTICD_SOCKET is ${#ELASTICD_SOCKET} bytes, over the 107 a UNIX socket allows: set ELASTIC_NODE_DIR to a shorter directory"

# $TMPDIR may be a shared /tmp: the directory is created 0700 by us, or must already be ours and
# not a link, before anything goes into it.
private_dir() {
	if ! mkdir -m 700 "$1" 2>/dev/null; then
		[[ -d $1 && ! -L $1 && -O $1 ]] || die "$1 exists and is not a directory of ours"
		chmod 700 "$1"
	fi
}

# The address of this node that the etcd host (and so, on a flat cluster network, every peer)
# routes to: the source address the kernel picks towards it. Nothing is sent.
route_source() {
	python3 -c 'import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect((sys.argv[1], 9))
print(s.getsockname()[0])' "$1"
}

start_daemon() {
	: "${ELASTIC_ETCD_ENDPOINT:?}" "${ELASTIC_TLS_DIR:?}"
	umask 077
	private_dir "$base"
	private_dir "$dir"
	local etcd_host=${ELASTIC_ETCD_ENDPOINT#https://}
	etcd_host=${etcd_host%:*}
	local address=${ELASTIC_NODE_ADDRESS:-$(route_source "$etcd_host")}
	local log=/dev/stderr jobs=$dir/jobs
	if [[ -n ${ELASTIC_LOG_DIR:-} ]]; then # kept after the allocation, for a post-mortem
		mkdir -p "$ELASTIC_LOG_DIR/$node"
		log=$ELASTIC_LOG_DIR/$node/elasticd.log
		jobs=$ELASTIC_LOG_DIR/$node/jobs
	fi
	local slots=${ELASTIC_SLOTS:-${SLURM_CPUS_ON_NODE:-}}
	echo "elastic-node.sh: elasticd on $node at $address, etcd $ELASTIC_ETCD_ENDPOINT, log $log" >&2
	# exec: srun's signals (scancel, the end of the allocation) reach elasticd itself, which stops
	# its workers (SIGTERM, grace, SIGKILL); its reaper sidecar kills them if elasticd is killed.
	exec elasticd \
		--node-id "$node" \
		--socket "$ELASTICD_SOCKET" --socket-mode 600 \
		--state-dir "$dir/state" \
		--log-dir "$jobs" \
		--address "$address" \
		--etcd-endpoints "$ELASTIC_ETCD_ENDPOINT" \
		--etcd-ca "$ELASTIC_TLS_DIR/ca.pem" \
		--etcd-cert "$ELASTIC_TLS_DIR/client.pem" \
		--etcd-key "$ELASTIC_TLS_DIR/client.key" \
		${slots:+--slots "$slots"} \
		--log-format json >>"$log" 2>&1
}

run_job() {
	local deadline=$((SECONDS + ${ELASTIC_DAEMON_WAIT:-120}))
	until elasticctl ping >/dev/null 2>&1; do
		((SECONDS < deadline)) || die "the elasticd of $node did not answer on $ELASTICD_SOCKET"
		sleep 0.5
	done
	exec elasticrun "$@"
}

case ${1:-} in
daemon) start_daemon ;;
run)
	shift
	run_job "$@"
	;;
*) die "usage: elastic-node.sh daemon | run ELASTICRUN-ARGS..." ;;
esac
