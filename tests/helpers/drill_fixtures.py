"""The two module fixtures every drill module needs (tests/e2e, tests/chaos), written once.

- `env`: the session stack's environment set in os.environ for the module (the drill helpers and the
  store factory read it from there), undone after the module.
- `rest`: a logged-in REST client with the drill pools and DAGs ready (longrun.drill.prepare). A loaded
  2-core host answers slowly, and SQLite under load answers "database is locked" as HTTP 500 now and then,
  so the client waits long and `prepare` is tried three times.

Imported into tests/e2e/conftest.py and tests/chaos/conftest.py; a module that needs something else defines
its own fixture of the same name, which takes precedence."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from longrun.drill import Rest, prepare

from helpers.stack_fixtures import AirflowStack

PREPARE_ATTEMPTS = 3


@pytest.fixture(scope="module")
def env(airflow_stack: AirflowStack) -> Iterator[AirflowStack]:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in airflow_stack.env.items():
            mp.setenv(k, v)
        yield airflow_stack


@pytest.fixture(scope="module")
def rest(env: AirflowStack) -> Rest:
    r = Rest.login(env.url, env.user, env.password, timeout=120.0)
    for attempt in range(PREPARE_ATTEMPTS):
        try:
            prepare(r)
            break
        except Exception:
            if attempt == PREPARE_ATTEMPTS - 1:
                raise
            time.sleep(5)
    return r
