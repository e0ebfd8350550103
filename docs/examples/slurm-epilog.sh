#!/bin/bash
# Slurm epilog: nothing to stop (the agent serves every job on the node); log the job's
# step counters for accounting, from the agent's /metrics on loopback.
set -u
curl -s --max-time 2 http://127.0.0.1:9477/metrics \
    | grep -E "^tuimon_job_(wall|compute)_seconds_total\{job=\"${SLURM_JOB_NAME:-}\"" \
    | logger -t "tuimon-job-${SLURM_JOB_ID:-?}" || true
exit 0
