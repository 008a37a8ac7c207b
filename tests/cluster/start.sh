#!/usr/bin/env bash
# Start a real one-node SLURM cluster on this machine for the integration test
# (tests/test_slurm.py): Debian's slurmctld, slurmd, slurm-client and munge,
# and slurmdbd on a local MariaDB so that `sacct` (the SLURM executor
# plugin's default status command) works.  No systemd: every daemon is
# started directly and its PID recorded in $STATE, so that stop.sh stops
# exactly what this script started.  Re-running it while the cluster is up
# changes nothing.  Needs root (apt-get, daemons).  Daemons get no stdio of
# this script: a CI runner waiting for its output pipe to close would hang.
#
#   bash tests/cluster/start.sh      # returns once the node is idle and `srun true` ran
#   bash tests/cluster/stop.sh
set -euo pipefail

STATE=${CANARY_SLURM_STATE:-/run/canary-audit-slurm}
PARTITION=debug
CLUSTER=canaryaudit
DB_PASS=canary-audit-local   # a local account of a MariaDB bound to 127.0.0.1
NODE=$(hostname -s)
LOGS=/var/log/slurm

say() { printf '[cluster %s] %s\n' "$(date +%T)" "$*"; }
fail() {
    say "ERROR: $*"
    for f in "$LOGS"/slurmctld.log "$LOGS"/slurmd.log "$LOGS"/slurmdbd.log "$STATE"/mariadb.log; do
        [ -f "$f" ] && { echo "--- last lines of $f"; tail -n 20 "$f"; }
    done
    exit 1
}
running() { [ -f "$STATE/$1.pid" ] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }
wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit=$1 what=$2
    shift 2
    for _ in $(seq "$limit"); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 1
    done
    fail "$what did not come up within ${limit}s"
}

[ "$(id -u)" -eq 0 ] || fail "run as root (it installs packages and starts daemons)"
mkdir -p "$STATE" "$LOGS" /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /run/slurm /run/munge /run/mysqld

# 1. Packages (Debian's own; no-op once installed).
PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)
missing=()
for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # policy-rc.d 101: the packages' own init scripts must not start daemons here.
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    rm -f /usr/sbin/policy-rc.d
fi

# 2. munge: a key, then the daemon as its own user.
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 0400 /etc/munge/munge.key
if ! running munged; then
    say "starting munged"
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid </dev/null >/dev/null 2>&1
    wait_for 10 munged test -s /run/munge/munged.pid
    cp /run/munge/munged.pid "$STATE/munged.pid"
fi
wait_for 10 "munge credentials" sh -c 'munge -n | unmunge'

# 3. MariaDB on 127.0.0.1 and the accounting database.
chown mysql:mysql /run/mysqld
if [ ! -d /var/lib/mysql/mysql ]; then
    mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
fi
if ! running mariadb; then
    say "starting mariadb"
    runuser -u mysql -- /usr/sbin/mariadbd --datadir=/var/lib/mysql --bind-address=127.0.0.1 \
        --socket=/run/mysqld/mysqld.sock --pid-file=/run/mysqld/mysqld.pid \
        --log-error="$STATE/mariadb.log" </dev/null >/dev/null 2>&1 &
    echo $! > "$STATE/mariadb.pid"
    wait_for 30 mariadb mariadb -e 'SELECT 1'
fi
mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"

# 4. Configuration.  slurmd -C reports this machine's real topology; memory
# is declared at 90% of it (a node that reports less than declared is drained).
read -r -a HW <<< "$(slurmd -C | head -n 1)"
NODE_LINE=""
for field in "${HW[@]}"; do
    case "$field" in
        RealMemory=*) NODE_LINE+=" RealMemory=$(( ${field#RealMemory=} * 9 / 10 ))" ;;
        UpTime=*) ;;
        *) NODE_LINE+=" $field" ;;
    esac
done
cat > "$STATE/slurm.conf" <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
MinJobAge=300
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
$(echo "$NODE_LINE" | sed 's/^ //') State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
cat > "$STATE/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
LogFile=$LOGS/slurmdbd.log
PidFile=/run/slurm/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
chmod 600 "$STATE/slurmdbd.conf"
changed=0
for f in slurm.conf slurmdbd.conf; do
    if ! cmp -s "$STATE/$f" "/etc/slurm/$f"; then
        install -m "$([ $f = slurmdbd.conf ] && echo 600 || echo 644)" "$STATE/$f" "/etc/slurm/$f"
        changed=1
    fi
done
if [ $changed = 1 ]; then  # new settings: restart what runs
    for d in slurmd slurmctld slurmdbd; do
        if running $d; then kill "$(cat "$STATE/$d.pid")"; rm -f "$STATE/$d.pid"; sleep 1; fi
    done
fi

# 5. Daemons: slurmdbd, the cluster's accounting record, slurmctld, slurmd.
if ! running slurmdbd; then
    say "starting slurmdbd"
    /usr/sbin/slurmdbd </dev/null >/dev/null 2>&1
    wait_for 30 slurmdbd test -s /run/slurm/slurmdbd.pid
    cp /run/slurm/slurmdbd.pid "$STATE/slurmdbd.pid"
    wait_for 30 "slurmdbd connection" sacctmgr -n list cluster
fi
sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
if ! running slurmctld; then
    say "starting slurmctld"
    /usr/sbin/slurmctld </dev/null >/dev/null 2>&1
    wait_for 30 slurmctld scontrol ping
    cp /run/slurm/slurmctld.pid "$STATE/slurmctld.pid"
fi
if ! running slurmd; then
    say "starting slurmd"
    /usr/sbin/slurmd </dev/null >/dev/null 2>&1
    wait_for 30 slurmd test -s /run/slurm/slurmd.pid
    cp /run/slurm/slurmd.pid "$STATE/slurmd.pid"
fi

# 6. Ready: the node idle, a trivial job through srun, sacct answering.
for _ in $(seq 60); do
    state=$(sinfo -h -N -n "$NODE" -o %t 2>/dev/null || true)
    case "$state" in
        idle|mix|alloc) break ;;
        down*|drain*|drng*) scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 1
done
[[ "$state" =~ ^(idle|mix|alloc) ]] || fail "node $NODE is '$state', not idle"
timeout 60 srun -N1 -t 1 true || fail "srun true failed"
sacct -n -X >/dev/null || fail "sacct does not answer"
say "cluster $CLUSTER up: node $NODE idle, partition $PARTITION"
