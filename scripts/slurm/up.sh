#!/usr/bin/env bash
# Start a single-machine SLURM (munged, mariadb, slurmdbd, slurmctld, slurmd) for development and CI.
#
#   bash scripts/slurm/up.sh            # one node "localhost"
#   SLURM_NODES=2 bash scripts/slurm/up.sh   # two nodes "node1", "node2" on this machine
#   eval "$(bash scripts/slurm/env.sh)"; sinfo
#   bash scripts/slurm/down.sh
#
# Installs the Debian packages when missing, writes every config, pid, log and spool file under
# the state dir ($SLURM_STATE_DIR, default <repo>/.slurm), and is idempotent: running it again
# only starts what is not running and waits until every node is idle. Must run as root.
#
# Environment knobs:
#   SLURM_STATE_DIR   state dir (default <repo>/.slurm)
#   SLURM_NODES       number of emulated nodes (default 1)
#   SLURM_CPUS        CPUs declared per node (default max(8, nproc)); more than the machine has,
#                     so that a sweep with more tasks than cores runs instead of pending
#   SLURM_UP_TIMEOUT  seconds to wait for the daemons and idle nodes (default 90)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
state=${SLURM_STATE_DIR:-$repo/.slurm}
n_nodes=${SLURM_NODES:-1}
timeout=${SLURM_UP_TIMEOUT:-90}
cluster=vmc
ctld_port=6817
slurmd_port=6818
dbd_port=6819
db_port=6820
export PATH="$PATH:/usr/sbin:/sbin"
export SLURM_CONF="$state/slurm.conf"

say() { printf '[slurm-up] %s\n' "$*" >&2; }

show_logs() {
  local f
  for f in "$state"/log/*.log /var/log/munge/munged.log; do
    [[ -s $f && $f != *install.log ]] || continue
    printf '\n----- last lines of %s -----\n' "$f" >&2
    tail -n 15 "$f" >&2
  done
}

# die MESSAGE: a daemon did not come up; show the log tails.
die() {
  printf '[slurm-up] ERROR: %s\n' "$*" >&2
  show_logs
  exit 1
}

# refuse MESSAGE: a usage or setup problem; the logs would not help.
refuse() {
  printf '[slurm-up] ERROR: %s\n' "$*" >&2
  exit 1
}

# True if the pid in file $1 is alive and its command name starts with $2.
running() {
  local pid
  [[ -s $1 ]] || return 1
  pid=$(<"$1")
  [[ $pid =~ ^[0-9]+$ ]] && [[ -r /proc/$pid/comm ]] || return 1
  [[ $(</proc/"$pid"/comm) == "$2"* ]]
}

# need_port PORT WHAT: refuse to start WHAT when something else already listens on PORT.
need_port() {
  if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    refuse "port $1, needed by $2, is already in use by another process (see: ss -ltnp | grep :$1)"
  fi
}

# wait_for SECONDS DESCRIPTION PIDFILE COMM COMMAND...: retry COMMAND every 0.2 s; give up early
# when the daemon of PIDFILE (skipped when "") has died after a 3 s grace for writing it.
wait_for() {
  local limit=$1 what=$2 pidfile=$3 comm=$4
  shift 4
  local start=$SECONDS
  until "$@" >/dev/null 2>&1; do
    if [[ -n $pidfile ]] && ((SECONDS > start + 3)) && ! running "$pidfile" "$comm"; then
      die "$comm exited while waiting for $what"
    fi
    ((SECONDS < start + limit)) || die "timed out after ${limit}s waiting for $what"
    sleep 0.2
  done
}

[[ $(id -u) == 0 ]] || refuse "run as root (the daemons run as root; munged and mariadb drop to their own users)"
[[ $n_nodes =~ ^[1-9][0-9]*$ ]] || refuse "SLURM_NODES must be a positive integer, got '$n_nodes'"
n_cpus=${SLURM_CPUS:-$(($(nproc) > 8 ? $(nproc) : 8))}
[[ $n_cpus =~ ^[1-9][0-9]*$ ]] || refuse "SLURM_CPUS must be a positive integer, got '$n_cpus'"

# ---------------------------------------------------------------------------------- install
install_packages() {
  local pkgs=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server) tmp_policy=
  local b missing=0
  for b in slurmctld slurmd sinfo sacct slurmdbd munged mungekey mariadbd mariadb-install-db; do
    command -v "$b" >/dev/null || missing=1
  done
  ((missing)) || return 0
  say "installing ${pkgs[*]}"
  if ! apt-cache show "${pkgs[@]}" >/dev/null 2>&1; then
    apt-get update -qq
  fi
  # Keep the packages' maintainer scripts from starting system-wide daemons (a mariadb on
  # 3306, a munged, a slurmctld with the default config) that down.sh would not know about.
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    tmp_policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' >"$tmp_policy"
    chmod 755 "$tmp_policy"
  fi
  local rc=0
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" \
    >"${TMPDIR:-/tmp}/slurm-apt.log" 2>&1 || rc=$?
  [[ -z $tmp_policy ]] || rm -f "$tmp_policy"
  if ((rc)); then
    tail -n 30 "${TMPDIR:-/tmp}/slurm-apt.log" >&2
    die "apt-get install failed (exit $rc)"
  fi
}
install_packages

# ---------------------------------------------------------------------------------- config
mkdir -p "$state"/{run,log,spool/slurmctld}
# The state dir ignores itself, whether or not the repository's .gitignore lists it.
[[ -e $state/.gitignore ]] || printf '*\n' >"$state/.gitignore"

if ((n_nodes == 1)); then
  nodes=(localhost)
else
  nodes=()
  for ((i = 1; i <= n_nodes; i++)); do nodes+=("node$i"); done
fi

mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)
mem_mb=$((mem_mb > 2048 ? mem_mb - 1024 : mem_mb))
ctld_host=$(hostname -s)

conf_new=$(mktemp)
trap 'rm -f "$conf_new"' EXIT
{
  cat <<EOF
# Generated by scripts/slurm/up.sh -- edits are overwritten.
ClusterName=$cluster
SlurmctldHost=$ctld_host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$state/spool/slurmctld
SlurmdSpoolDir=$state/spool/slurmd-%n
SlurmctldPidFile=$state/run/slurmctld.pid
SlurmdPidFile=$state/run/slurmd-%n.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups and no systemd here: track processes by parent pid, no task affinity.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# Take CPUs/RealMemory from the NodeName lines, not from the hardware (we declare more CPUs).
SlurmdParameters=config_overrides
# Accounting through slurmdbd, so that sacct (and submitit) see finished and cancelled jobs.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$dbd_port
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
KillOnBadExit=1
KillWait=5
ReturnToService=2
InactiveLimit=0
MinJobAge=300
SlurmdTimeout=60
MailProg=/bin/true
EOF
  for i in "${!nodes[@]}"; do
    if ((n_nodes == 1)); then port=$slurmd_port; else port=$((6830 + i + 1)); fi
    echo "NodeName=${nodes[$i]} NodeAddr=127.0.0.1 Port=$port CPUs=$n_cpus RealMemory=$mem_mb State=UNKNOWN"
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE OverSubscribe=YES State=UP"
} >"$conf_new"

any_running() {
  local f
  for f in "$state"/run/slurm*.pid; do
    [[ -e $f ]] || continue
    running "$f" slurm && return 0
  done
  return 1
}

if [[ -f $SLURM_CONF ]] && ! cmp -s "$conf_new" "$SLURM_CONF"; then
  if any_running; then
    diff "$SLURM_CONF" "$conf_new" >&2 || true
    refuse "SLURM is running from $state with a different configuration (see the diff above); run scripts/slurm/down.sh first"
  fi
fi
cp "$conf_new" "$SLURM_CONF"

# jax.distributed and srun resolve node names; map the emulated ones to loopback.
unresolved=()
for n in "${nodes[@]}"; do getent hosts "$n" >/dev/null || unresolved+=("$n"); done
if ((${#unresolved[@]})); then
  say "adding '127.0.0.1 ${unresolved[*]}' to /etc/hosts"
  printf '127.0.0.1 %s  # vmc-runner scripts/slurm/up.sh\n' "${unresolved[*]}" >>/etc/hosts
fi

t_start=$SECONDS

# ---------------------------------------------------------------------------------- munge
munge_ok() { { munge -n </dev/null | unmunge; } >/dev/null 2>&1; }
if running "$state/run/munged.pid" munged; then
  :
elif munge_ok; then
  say "using the munged that is already running (not started by up.sh, so down.sh leaves it)"
else
  if [[ ! -s /etc/munge/munge.key ]]; then
    say "creating /etc/munge/munge.key"
    mkdir -p /etc/munge
    mungekey --create --keyfile=/etc/munge/munge.key
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  chmod 755 /run/munge
  runuser -u munge -- /usr/sbin/munged || die "munged failed to start"
  wait_for 10 "munged" "" "" test -s /run/munge/munged.pid
  cp /run/munge/munged.pid "$state/run/munged.pid"
  wait_for 10 "munge to answer" "$state/run/munged.pid" munged munge_ok
fi

# ---------------------------------------------------------------------------------- mariadb
db_dir=$state/mariadb
db_sock=$db_dir/mysqld.sock
db_pid=$db_dir/mariadb.pid
# mariadb runs as root like the SLURM daemons: as user mysql it could not enter a checkout whose
# parents are private (mktemp -d, a home directory), and this database only serves 127.0.0.1.
mkdir -p "$db_dir"
if [[ ! -s $state/dbpass ]]; then
  (umask 077 && head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$state/dbpass")
fi
db_pass=$(<"$state/dbpass")

if ! running "$db_pid" mariadbd; then
  if [[ ! -d $db_dir/data/mysql ]]; then
    say "initialising the accounting database in $db_dir/data"
    mariadb-install-db --no-defaults --user=root --datadir="$db_dir/data" \
      --auth-root-authentication-method=socket --skip-test-db >"$state/log/mariadb-install.log" 2>&1 ||
      die "mariadb-install-db failed (see $state/log/mariadb-install.log)"
  fi
  need_port "$db_port" mariadb
  rm -f "$db_sock"
  setsid nohup mariadbd --no-defaults --user=root --datadir="$db_dir/data" \
    --socket="$db_sock" --pid-file="$db_pid" --port="$db_port" --bind-address=127.0.0.1 \
    --skip-name-resolve --log-error="$state/log/mariadb.log" \
    --innodb-buffer-pool-size=256M --innodb-log-file-size=64M --innodb-lock-wait-timeout=900 \
    </dev/null >>"$state/log/mariadb.log" 2>&1 &
fi
wait_for "$timeout" "mariadb" "$db_pid" mariadbd mariadb-admin --no-defaults --socket="$db_sock" -u root ping
mariadb --no-defaults --socket="$db_sock" -u root <<EOF || die "could not create the slurm database user"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$db_pass';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
EOF

# ---------------------------------------------------------------------------------- slurmdbd
(
  umask 077 # slurmdbd refuses a slurmdbd.conf readable by others (it holds the password)
  cat >"$state/slurmdbd.conf" <<EOF
# Generated by scripts/slurm/up.sh -- edits are overwritten.
AuthType=auth/munge
DbdHost=$ctld_host
DbdAddr=127.0.0.1
DbdPort=$dbd_port
SlurmUser=root
LogFile=$state/log/slurmdbd.log
PidFile=$state/run/slurmdbd.pid
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StoragePass=$db_pass
StorageLoc=slurm_acct_db
EOF
)
if ! running "$state/run/slurmdbd.pid" slurmdbd; then
  need_port "$dbd_port" slurmdbd
  # slurmdbd reads slurmdbd.conf from the directory of $SLURM_CONF.
  slurmdbd || die "slurmdbd failed to start"
fi
wait_for "$timeout" "slurmdbd" "$state/run/slurmdbd.pid" slurmdbd sacctmgr -n list cluster
if [[ -z $(sacctmgr -n -P list cluster "$cluster" format=cluster 2>/dev/null) ]]; then
  sacctmgr -i add cluster "$cluster" >/dev/null || die "sacctmgr add cluster $cluster failed"
fi

# ---------------------------------------------------------------------------------- slurmctld
if ! running "$state/run/slurmctld.pid" slurmctld; then
  need_port "$ctld_port" slurmctld
  slurmctld || die "slurmctld failed to start"
fi
ctld_up() { scontrol ping | grep -q UP; }
wait_for "$timeout" "slurmctld" "$state/run/slurmctld.pid" slurmctld ctld_up

# ---------------------------------------------------------------------------------- slurmd
for n in "${nodes[@]}"; do
  mkdir -p "$state/spool/slurmd-$n"
  if ! running "$state/run/slurmd-$n.pid" slurmd; then
    need_port "$(awk -v n="$n" '$1 == "NodeName=" n {sub("Port=", "", $3); print $3}' "$SLURM_CONF")" "slurmd $n"
    slurmd -N "$n" || die "slurmd for node $n failed to start"
  fi
done

# ---------------------------------------------------------------------------------- wait idle
deadline=$((SECONDS + timeout))
while :; do
  bad=()
  while read -r node st; do
    case $st in
      idle | mixed | allocated | completing) ;;
      drained | down) # responding but out of service (e.g. left drained by an earlier run)
        say "resuming node $node ($st)"
        scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
        bad+=("$node=$st") ;;
      *) bad+=("$node=$st") ;;
    esac
  done < <(sinfo -h -N -o '%N %T' 2>/dev/null || true)
  ((${#bad[@]} == 0)) && [[ -n $(sinfo -h -N -o '%N' 2>/dev/null) ]] && break
  for n in "${nodes[@]}"; do
    ((SECONDS > deadline - timeout + 3)) && ! running "$state/run/slurmd-$n.pid" slurmd &&
      die "slurmd for node $n exited"
  done
  if ((SECONDS >= deadline)); then
    sinfo -N -l >&2 || true
    die "timed out after ${timeout}s waiting for the nodes to be idle (${bad[*]:-no nodes})"
  fi
  sleep 0.5
done

say "up in $((SECONDS - t_start))s: ${#nodes[@]} node(s) (${nodes[*]}), $n_cpus CPUs each, state in $state"
say "use it with: eval \"\$(bash $here/env.sh)\""
sinfo
