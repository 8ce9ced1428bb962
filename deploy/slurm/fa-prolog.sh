#!/bin/sh
# fa-prolog.sh - Slurm Prolog (slurm.conf: Prolog=/etc/slurm/fa-prolog.sh, PrologFlags=Alloc):
# start a per-job fa-daemon on the job's GPUs, as the job's user, before its first task.
#
# Per job, not per node: the daemon runs as the job's uid, so the asynchronous mode (CUDA IPC
# events, which open only between processes of one uid) works, the socket is private to the
# user (mode 0600), and nothing outlives the job (fa-epilog.sh stops it). The job's tasks find
# it through FA_SOCKET, which fa-task-prolog.sh exports.
#
# Runs as root on the node, with Slurm's prolog environment: SLURM_JOB_ID, SLURM_JOB_UID,
# SLURM_JOB_GID, SLURM_JOB_USER and SLURM_JOB_GPUS (the node's GPU indices of the job, with
# gres/gpu; nvidia-smi's PCI order, hence CUDA_DEVICE_ORDER=PCI_BUS_ID). A failed start fails the
# prolog, which drains the node in Slurm's usual way; a job without GPUs gets a CPU daemon.
#
# Where systemd runs the node, the daemon is a transient unit (systemd-run, Type=notify: started
# when READY=1 came, with the unit's limits); elsewhere it is started in the background and the
# prolog waits until `fa-ctl ping` answers. Overrides for tests and odd layouts:
# FA_BINDIR (/usr/local/bin), FA_RUNDIR (/run/fa-daemon), FA_SLURM_SYSTEMD (auto|0|1),
# FA_START_TIMEOUT_S (120), FA_DAEMON_ARGS (extra options, e.g. --threads=8).
set -eu

: "${SLURM_JOB_ID:?fa-prolog: SLURM_JOB_ID is not set (run as a Slurm Prolog)}"
: "${SLURM_JOB_UID:?fa-prolog: SLURM_JOB_UID is not set}"
bindir=${FA_BINDIR:-/usr/local/bin}
rundir=${FA_RUNDIR:-/run/fa-daemon}
dir="$rundir/job-$SLURM_JOB_ID"
sock="$dir/fa.sock"
gid=${SLURM_JOB_GID:-$(id -g "$SLURM_JOB_UID")}
timeout=${FA_START_TIMEOUT_S:-120}
gpus=${SLURM_JOB_GPUS:-}

log() { echo "fa-prolog: job $SLURM_JOB_ID: $*" >&2; }

# The job's GPUs only (an empty list: no GPU, the CPU backend).
if [ -n "$gpus" ]; then
	visible=$gpus
	backend=auto
else
	visible=
	backend=cpu
fi

# The parent is shared by every job (root, 0755); each job's directory is its user's alone.
install -d -m 0755 "$rundir"
if [ "$(id -u)" = 0 ]; then
	install -d -m 0700 -o "$SLURM_JOB_UID" -g "$gid" "$dir"
else
	install -d -m 0700 "$dir"
fi

use_systemd=${FA_SLURM_SYSTEMD:-auto}
if [ "$use_systemd" = auto ]; then
	if [ -d /run/systemd/system ] && command -v systemd-run >/dev/null 2>&1; then
		use_systemd=1
	else
		use_systemd=0
	fi
fi

# shellcheck disable=SC2086 # FA_DAEMON_ARGS is a list of words on purpose
if [ "$use_systemd" = 1 ]; then
	systemd-run --unit="fa-daemon-job-$SLURM_JOB_ID" --description="fa-daemon for Slurm job $SLURM_JOB_ID" \
		--uid="$SLURM_JOB_UID" --gid="$gid" \
		-p Type=notify -p NotifyAccess=main -p TimeoutStartSec="$timeout" -p TimeoutStopSec=60 \
		-p LimitNOFILE=1024:8192 -p WatchdogSec=30 -p UMask=0077 \
		--setenv=CUDA_DEVICE_ORDER=PCI_BUS_ID --setenv=CUDA_VISIBLE_DEVICES="$visible" \
		--setenv=CUDA_CACHE_PATH="$dir/nv" \
		"$bindir/fa-daemon" --socket "$sock" --socket-mode 0600 --backend "$backend" \
		--cache-dir "$dir/cache" ${FA_DAEMON_ARGS:-}
	log "started unit fa-daemon-job-$SLURM_JOB_ID on GPUs '${visible:-none}' at $sock"
	exit 0
fi

# No systemd: a background process of the job's user, its pid kept for the epilog. Root drops
# to the user; a prolog run as the user itself (tests) has nothing to drop.
if [ "$(id -u)" = 0 ]; then
	set -- setpriv --reuid="$SLURM_JOB_UID" --regid="$gid" --clear-groups
else
	set --
fi
# shellcheck disable=SC2086 # FA_DAEMON_ARGS is a list of words on purpose
setsid env CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES="$visible" CUDA_CACHE_PATH="$dir/nv" \
	"$@" "$bindir/fa-daemon" --socket "$sock" --socket-mode 0600 --backend "$backend" \
	--cache-dir "$dir/cache" ${FA_DAEMON_ARGS:-} </dev/null >>"$dir/daemon.log" 2>&1 &
echo $! > "$dir/daemon.pid"
i=0
while ! "$@" "$bindir/fa-ctl" --socket "$sock" --timeout 1000 ping >/dev/null 2>&1; do
	if ! kill -0 "$(cat "$dir/daemon.pid")" 2>/dev/null; then
		log "fa-daemon exited at start; its log:"; tail -n 20 "$dir/daemon.log" >&2
		exit 1
	fi
	i=$((i + 1))
	if [ "$i" -gt $((timeout * 5)) ]; then
		log "fa-daemon did not answer within ${timeout}s"; kill "$(cat "$dir/daemon.pid")" 2>/dev/null || true
		exit 1
	fi
	sleep 0.2
done
log "started fa-daemon (pid $(cat "$dir/daemon.pid")) on GPUs '${visible:-none}' at $sock"
