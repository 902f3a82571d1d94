#!/bin/sh
# Every longrun container: install the shared munge key and start munged (Slurm clients and daemons
# authenticate through it), then run the command. `slurmctld` and `slurmd` run in the foreground, the
# node named after the container's host name.
set -eu
KEY_SRC=${MUNGE_KEY_SRC:-/run/munge-key/munge.key}
if [ -s "$KEY_SRC" ]; then
  install -o munge -g munge -m 0400 "$KEY_SRC" /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- munged
elif [ "${LONGRUN_NEEDS_MUNGE:-0}" = 1 ]; then
  echo "longrun-entrypoint: no munge key at $KEY_SRC (the munge-key service creates it)" >&2
  exit 1
fi
case "${1:-}" in
  slurmctld) exec slurmctld -D -v ;;
  slurmd) exec slurmd -D -v -N "${SLURM_NODE:-$(hostname -s)}" ;;
  *) exec "$@" ;;
esac
