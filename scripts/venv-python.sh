#!/usr/bin/env bash
# Prints the interpreter .venv is built from, resolved (links followed): the one place that chooses it,
# used by the Makefile (to build .venv, and to rebuild one built from another interpreter) and by
# scripts/setup-system.sh (to check the version and python3-venv of that interpreter).
#
# Why this choice: the local stack's jobs run as an unprivileged job user (docs/security.md, item 14),
# and run the venv's Python. A venv links to its base interpreter, so the job user must be able to run
# that interpreter. Debian's /usr/bin/python3 is runnable by every local user; a Python under a private
# home (pyenv's, for one) is not. So Debian's python3 comes first when it is a version longrun supports
# (3.11 or 3.12: pyproject's requires-python, and what requirements.lock is resolved for; Debian 12 ships
# 3.11). Else python3 on PATH: the stack then checks whether the job user can run it, and falls back,
# saying so, to jobs as the orchestrator's user when it cannot.
#
# Exit 1, saying why on stderr, when neither is 3.11 or 3.12. LONGRUN_SYSTEM_PYTHON names another system
# Python to prefer (default /usr/bin/python3).
set -euo pipefail
SYSTEM_PYTHON=${LONGRUN_SYSTEM_PYTHON:-/usr/bin/python3}
supported='import os, sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 13) else 1)'
resolved='import os, sys; print(os.path.realpath(sys.executable))'
version_of() { if command -v "$1" >/dev/null; then "$1" -V 2>&1; else echo absent; fi; }

if [ -x "$SYSTEM_PYTHON" ] && "$SYSTEM_PYTHON" -c "$supported" 2>/dev/null; then
  "$SYSTEM_PYTHON" -c "$resolved"
  exit 0
fi
if command -v python3 >/dev/null && python3 -c "$supported" 2>/dev/null; then
  echo "venv-python: $SYSTEM_PYTHON is $(version_of "$SYSTEM_PYTHON"), not 3.11 or 3.12; using python3 on PATH. The local stack's" \
    "jobs run as its job user only if that user can run this interpreter (docs/security.md, item 14)" >&2
  python3 -c "$resolved"
  exit 0
fi
echo "venv-python: longrun needs Python 3.11 or 3.12 (Debian 12's python3); $SYSTEM_PYTHON is" \
  "$(version_of "$SYSTEM_PYTHON"), python3 on PATH is $(version_of python3)." >&2
echo "venv-python: install Debian 12's python3, or put a 3.11 or 3.12 python3 first on PATH, and rerun" >&2
exit 1
