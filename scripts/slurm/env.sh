#!/usr/bin/env bash
# Print the exports a shell needs to talk to the local SLURM of scripts/slurm/up.sh:
#   eval "$(bash scripts/slurm/env.sh)"
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
state=${SLURM_STATE_DIR:-$repo/.slurm}
printf 'export SLURM_CONF=%q\n' "$state/slurm.conf"
