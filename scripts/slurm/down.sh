#!/usr/bin/env bash
# Stop what scripts/slurm/up.sh started (by the pid files in its state dir); idempotent.
#
#   bash scripts/slurm/down.sh           # stop; keep the state dir (job history, database)
#   bash scripts/slurm/down.sh --purge   # stop and delete the state dir
#
# Jobs still queued or running are cancelled first, so that they end in the accounting
# database as CANCELLED rather than being orphaned. A munged that up.sh found already running
# is left alone.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
state=${SLURM_STATE_DIR:-$repo/.slurm}
export PATH="$PATH:/usr/sbin:/sbin"
export SLURM_CONF="$state/slurm.conf"
purge=0
case ${1:-} in
  "") ;;
  --purge) purge=1 ;;
  *) echo "usage: $0 [--purge]" >&2; exit 2 ;;
esac

say() { printf '[slurm-down] %s\n' "$*" >&2; }

# Print the pid in file $1 if it is alive and its command name starts with $2.
live_pid() {
  local pid
  [[ -s $1 ]] || return 1
  pid=$(<"$1")
  [[ $pid =~ ^[0-9]+$ ]] && [[ -r /proc/$pid/comm ]] || return 1
  [[ $(</proc/"$pid"/comm) == "$2"* ]] || return 1
  echo "$pid"
}

# stop SECONDS PIDFILE:COMM...: SIGTERM them all, wait up to SECONDS, then SIGKILL what is
# left; remove the pid files. Each daemon takes ~2 s to exit, so a group is stopped together.
stop() {
  local limit=$1 item file comm pid i pids=()
  shift
  for item in "$@"; do
    file=${item%:*} comm=${item##*:}
    if pid=$(live_pid "$file" "$comm"); then
      say "stopping $comm (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
    rm -f "$file"
  done
  for pid in "${pids[@]}"; do
    for ((i = 0; i < limit * 10; i++)); do
      [[ -d /proc/$pid ]] || break
      sleep 0.1
    done
    if [[ -d /proc/$pid ]]; then
      say "pid $pid ignored SIGTERM for ${limit}s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
}

[[ -d $state ]] || { say "nothing to stop ($state does not exist)"; exit 0; }

if live_pid "$state/run/slurmctld.pid" slurmctld >/dev/null; then
  mapfile -t jobs < <(squeue -h -o %i 2>/dev/null || true)
  if ((${#jobs[@]})); then
    say "cancelling jobs: ${jobs[*]}"
    scancel "${jobs[@]}" 2>/dev/null || true
    for ((i = 0; i < 75; i++)); do
      [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.2
    done
  fi
fi

# slurmctld reports to slurmdbd, which writes to mariadb: stop them in that order.
slurm_daemons=("$state/run/slurmctld.pid:slurmctld")
for f in "$state"/run/slurmd-*.pid; do
  [[ -e $f ]] && slurm_daemons+=("$f:slurmd")
done
stop 15 "${slurm_daemons[@]}"
stop 15 "$state/run/slurmdbd.pid:slurmdbd"
stop 60 "$state/mariadb/mariadb.pid:mariadbd" "$state/run/munged.pid:munged"

if ((purge)); then
  say "removing $state"
  rm -rf "$state"
fi
say "down"
