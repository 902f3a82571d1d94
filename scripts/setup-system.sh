#!/usr/bin/env bash
# Installs the Debian packages the local stack and the browser test need. Safe to rerun: it only calls
# apt-get when something is missing. Needs root (as on this project's machines and CI).
set -euo pipefail
# The project's Python: 3.11 or 3.12 (pyproject's requires-python; requirements.lock is resolved for
# them). Debian 12's python3 is 3.11; Debian 13's is 3.13, which the lock does not cover: say so now
# rather than fail halfway through the install.
if ! python3 -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 13) else 1)'; then
  echo "setup-system: python3 is $(python3 -V 2>&1); longrun needs Python 3.11 or 3.12 (Debian 12's python3)." >&2
  echo "setup-system: put a 3.11 or 3.12 python3 first on PATH and rerun" >&2
  exit 1
fi
need=()
# `python3 -m venv` (the Makefile) needs ensurepip, which Debian ships in python3-venv.
python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
command -v munged >/dev/null || need+=(munge)
command -v slurmctld >/dev/null || need+=(slurmctld)
command -v slurmd >/dev/null || need+=(slurmd)
command -v sbatch >/dev/null || need+=(slurm-client)
command -v ss >/dev/null || need+=(iproute2)
# Airflow's metadata database for `longrun stack up --db postgres` (started by the stack, not as a service).
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
if [ "${LONGRUN_WITH_BROWSER:-1}" = 1 ]; then
  command -v chromium >/dev/null || need+=(chromium)
fi
if [ ${#need[@]} -eq 0 ]; then
  echo "setup-system: Debian packages present"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "setup-system: missing ${need[*]}; run as root or install them with apt-get" >&2
  exit 1
fi
echo "setup-system: installing ${need[*]} (Debian packages)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "setup-system: done"
