#!/bin/sh
# fa-epilog.sh - Slurm Epilog (slurm.conf: Epilog=/etc/slurm/fa-epilog.sh): stop the job's
# fa-daemon (SIGTERM: it drains, answers what runs, unmaps every buffer) and remove its
# directory. Runs as root after the job's last task; never fails the node for a daemon that is
# already gone. Same overrides as fa-prolog.sh.
set -u
: "${SLURM_JOB_ID:?fa-epilog: SLURM_JOB_ID is not set (run as a Slurm Epilog)}"
rundir=${FA_RUNDIR:-/run/fa-daemon}
dir="$rundir/job-$SLURM_JOB_ID"
use_systemd=${FA_SLURM_SYSTEMD:-auto}
if [ "$use_systemd" = auto ]; then
	if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
		use_systemd=1
	else
		use_systemd=0
	fi
fi
if [ "$use_systemd" = 1 ]; then
	systemctl stop "fa-daemon-job-$SLURM_JOB_ID.service" 2>/dev/null || true
elif [ -f "$dir/daemon.pid" ]; then
	pid=$(cat "$dir/daemon.pid")
	if kill -TERM "$pid" 2>/dev/null; then
		# The drain is bounded by the running requests; give it what systemd gives it.
		i=0
		while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 300 ]; do
			sleep 0.2
			i=$((i + 1))
		done
		kill -KILL "$pid" 2>/dev/null || true
	fi
fi
rm -rf "$dir"
exit 0
