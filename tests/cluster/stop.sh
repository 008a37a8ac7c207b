#!/usr/bin/env bash
# Stop exactly the daemons tests/cluster/start.sh started (their PIDs are in
# $STATE), in reverse order; leaves packages and configuration in place.
set -uo pipefail

STATE=${CANARY_SLURM_STATE:-/run/canary-audit-slurm}
[ -d "$STATE" ] || exit 0
for d in slurmd slurmctld slurmdbd mariadb munged; do
    pidfile="$STATE/$d.pid"
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        echo "[cluster] stopped $d ($pid)"
    fi
    rm -f "$pidfile"
done
