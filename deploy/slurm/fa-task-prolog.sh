#!/bin/sh
# fa-task-prolog.sh - Slurm TaskProlog (slurm.conf: TaskProlog=/etc/slurm/fa-task-prolog.sh):
# point every task of the job at its fa-daemon. slurmd reads "export NAME=VALUE" lines from a
# task prolog's standard output into the task's environment. Runs as the job's user.
rundir=${FA_RUNDIR:-/run/fa-daemon}
if [ -n "${SLURM_JOB_ID:-}" ] && [ -S "$rundir/job-$SLURM_JOB_ID/fa.sock" ]; then
	echo "export FA_SOCKET=$rundir/job-$SLURM_JOB_ID/fa.sock"
fi
