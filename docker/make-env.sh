#!/bin/sh
# Writes .env at the repository root with fresh secrets for docker-compose.yaml (never committed).
# Keeps an existing .env: the Postgres volume was initialised with its password.
set -eu
cd "$(dirname "$0")/.."
umask 077
if [ -e .env ]; then
  # Keys added since the .env was written (the job identity's) are appended; the rest is kept.
  if ! grep -q '^S3_JOB_ACCESS_KEY=' .env; then
    python3 -c 'import secrets; print(f"S3_JOB_ACCESS_KEY=longrunjob{secrets.token_hex(6)}"); print(f"S3_JOB_SECRET_KEY={secrets.token_urlsafe(30)}")' >> .env
    echo "make-env: added the job identity's keys to .env"
  fi
  echo "make-env: .env exists; keeping it (delete it and the volumes to start over)"
  exit 0
fi
python3 - <<'PY' > .env
import base64, secrets
tok = lambda n=24: secrets.token_urlsafe(n)
print(f"POSTGRES_PASSWORD={tok()}")
print(f"AIRFLOW_FERNET_KEY={base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()}")
print(f"AIRFLOW_JWT_SECRET={tok(32)}")
print(f"AIRFLOW_API_SECRET_KEY={tok(32)}")
print(f"S3_ACCESS_KEY=longrun{secrets.token_hex(6)}")
print(f"S3_SECRET_KEY={tok(30)}")
print(f"S3_JOB_ACCESS_KEY=longrunjob{secrets.token_hex(6)}")
print(f"S3_JOB_SECRET_KEY={tok(30)}")
PY
echo "make-env: wrote .env (0600)"
