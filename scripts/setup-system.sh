#!/usr/bin/env bash
# Installs the Debian packages the local stack and the browser test need. Safe to rerun: it only calls
# apt-get when something is missing. Needs root (as on this project's machines and CI).
set -euo pipefail
# The project's Python: 3.11 or 3.12 (pyproject's requires-python; requirements.lock is resolved for
# them). The check is of the interpreter .venv is built from, chosen in one place (scripts/venv-python.sh:
# Debian's python3 when it is 3.11 or 3.12, else python3 on PATH). Debian 12's python3 is 3.11; Debian 13's
# is 3.13, which the lock does not cover: say so now rather than fail halfway through the install.
python=$("$(dirname "$0")"/venv-python.sh)
need=()
# `python -m venv` (the Makefile) needs ensurepip, which Debian ships in python3-venv.
"$python" -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
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
