#!/bin/bash
# Slurm prolog (runs as root on each node of a job before it starts): make sure the node's
# agent is up, and give the job's ranks the step socket. Pair with slurm-epilog.sh.
# slurm.conf: Prolog=/etc/slurm/prolog.d/tuimon.sh  (and TaskProlog for the variable)
set -u
if ! systemctl is-active --quiet tuimon-agent; then
    systemctl start tuimon-agent || logger -t tuimon "agent did not start on $(hostname)"
fi
# TaskProlog lines starting with "export" set the job's environment.
echo "export TUIMON_STEPS_SOCKET=/run/tuimon/steps.sock"
exit 0   # never fail a job because monitoring is down
