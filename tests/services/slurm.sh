#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for the SLURM test tier (tests/slurm):
#   slurm.sh up <dir>     configure munge, MariaDB, slurmdbd, slurmctld and slurmd under <dir>, start them,
#                         register the cluster, account "ci" and this user, and wait for the node
#   slurm.sh down <dir>   cancel every job, stop the daemons
# Clients find the cluster through SLURM_CONF=<dir>/slurm.conf. Needs root and Debian's slurmctld, slurmd,
# slurmdbd, slurm-client, munge and mariadb-server packages (.ci/run installs them). Accounting is real
# (slurmdbd on MariaDB), so `sacct` answers as on a production cluster: the executor plugin polls it.
# The node offers this machine's CPUs and memory and 8 "gpu" GRES backed by stand-in files, so GPU requests
# are scheduled and counted as on a GPU box (no device is bound).
set -euo pipefail
action=${1:?usage: slurm.sh up|down <dir>}
dir=$(realpath -m "${2:?usage: slurm.sh up|down <dir>}")
conf=$dir/slurm.conf

stop_pidfile() {  # stop the daemon whose pid the file holds, then wait for it to go
  local pidfile=$1 pid
  [[ -f $pidfile ]] || return 0
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

if [[ $action == down ]]; then
  if [[ -f $conf ]]; then
    SLURM_CONF=$conf scancel --full --user "$(id -un)" 2>/dev/null || true
  fi
  stop_pidfile "$dir/slurmd.pid"
  stop_pidfile "$dir/slurmctld.pid"
  stop_pidfile "$dir/slurmdbd.pid"
  stop_pidfile "$dir/mariadb.pid"
  stop_pidfile "$dir/munged.pid"
  [[ $(readlink /etc/slurm/slurm.conf 2>/dev/null) == "$conf" ]] && rm -f /etc/slurm/slurm.conf
  exit 0
fi
[[ $action == up ]] || { echo "slurm.sh: unknown action '$action' (up or down)" >&2; exit 2; }

for cmd in slurmctld slurmd slurmdbd sbatch sacctmgr munged mariadbd mariadb-install-db; do
  command -v "$cmd" >/dev/null || { echo "slurm.sh: $cmd not found; install slurmctld slurmd slurmdbd slurm-client munge mariadb-server" >&2; exit 3; }
done
[[ $(id -u) == 0 ]] || { echo "slurm.sh: the daemons need root" >&2; exit 3; }

node=$(hostname -s)
cpus=$(nproc)
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
mkdir -p "$dir"/{spool,state,munge,log,dev}
touch "$dir"/dev/gpu{0..7}  # stand-ins for /dev/nvidia*: GRES needs a file per device
chmod 700 "$dir/munge"

# munge: a key and socket of the cluster's own, so nothing on the machine is touched
if [[ ! -f $dir/munge/munge.key ]]; then
  dd if=/dev/urandom bs=1 count=1024 of="$dir/munge/munge.key" status=none
  chmod 400 "$dir/munge/munge.key"
fi
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munged.pid" --seed-file="$dir/munge/seed" --log-file="$dir/log/munged.log"

cat >"$conf" <<CONF
ClusterName=specsweep-ci
SlurmctldHost=$node(127.0.0.1)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
AccountingStoragePass=$dir/munge/munge.socket
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
MinJobAge=3600
KillWait=5
InactiveLimit=0
GresTypes=gpu
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb Gres=gpu:8 State=UNKNOWN
PartitionName=ci Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
cat >"$dir/gres.conf" <<CONF
NodeName=$node Name=gpu File=$dir/dev/gpu[0-7]
CONF
# slurmd reads cgroup.conf only for cgroup plugins; an empty one keeps it from looking elsewhere
: >"$dir/cgroup.conf"

# Clients find it at SLURM_CONF, and at the standard place too: the executor plugin's job steps drop SLURM_*
# variables (SLURM_CONF among them) before their nested srun, which then reads /etc/slurm/slurm.conf.
if [[ -L /etc/slurm/slurm.conf || ! -e /etc/slurm/slurm.conf ]]; then
  mkdir -p /etc/slurm && ln -sfn "$conf" /etc/slurm/slurm.conf
else
  echo "slurm.sh: /etc/slurm/slurm.conf exists and is not ours; jobs' srun will read it, not $conf" >&2
fi
export SLURM_CONF=$conf  # slurmdbd, too, finds its slurmdbd.conf beside it
# MariaDB on a loopback port of its own, for slurmdbd
db_port=${SLURM_CI_DB_PORT:-3307}
if [[ ! -d $dir/mysql/mysql ]]; then
  mariadb-install-db --user=root --datadir="$dir/mysql" --auth-root-authentication-method=socket \
    >"$dir/log/mariadb-install.log" 2>&1
fi
setsid mariadbd --user=root --datadir="$dir/mysql" --socket="$dir/mysql.sock" --port="$db_port" --bind-address=127.0.0.1 \
  --pid-file="$dir/mariadb.pid" --log-error="$dir/log/mariadb.log" --skip-name-resolve </dev/null >/dev/null 2>&1 &
for _ in $(seq 100); do mariadb -S "$dir/mysql.sock" -e 'select 1' >/dev/null 2>&1 && break; sleep 0.2; done
mariadb -S "$dir/mysql.sock" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm-ci';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"

cat >"$dir/slurmdbd.conf" <<CONF
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
PidFile=$dir/slurmdbd.pid
LogFile=$dir/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StoragePass=slurm-ci
StorageLoc=slurm_acct_db
CONF
chmod 600 "$dir/slurmdbd.conf"
slurmdbd
for _ in $(seq 100); do timeout 2 bash -c "echo >/dev/tcp/127.0.0.1/6819" 2>/dev/null && break; sleep 0.2; done

sacctmgr -i add cluster specsweep-ci >/dev/null 2>&1 || true
sacctmgr -i add account ci Description="specsweep CI" Organization=specsweep >/dev/null 2>&1 || true
sacctmgr -i add user "$(id -un)" Account=ci >/dev/null 2>&1 || true
slurmctld -f "$conf"
slurmd -f "$conf"
for i in $(seq 100); do
  for d in slurmctld slurmd; do
    (( i > 5 )) || continue  # their pid files appear once they have daemonized
    [[ -f $dir/$d.pid ]] && kill -0 "$(cat "$dir/$d.pid")" 2>/dev/null || { state="$d not running"; break 2; }
  done
  state=$(sinfo -h -N -o %t 2>/dev/null | head -1 || true)
  case $state in idle*|mix*|alloc*) echo "slurm.sh: node $node up ($cpus CPUs, ${mem_mb} MB, gpu:8); SLURM_CONF=$conf"; exit 0;; esac
  sleep 0.2
done
echo "slurm.sh: node $node did not come up (state '${state:-none}'); logs:" >&2
tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
exit 4
