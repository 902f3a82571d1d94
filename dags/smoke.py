"""`smoke`: one trivial task, to prove the local stack's scheduler, executor and API work end to end.

The task reports which stack variables it sees (names only, never values), so a test can check that
`longrun stack` hands Slurm and S3 settings down to tasks; and whether torch was imported before it ran
(the stack's `preload_torch`: the scheduler imports it, its forked tasks inherit it).
"""

from __future__ import annotations

import os
import sys

from airflow.sdk import dag, task

STACK_VARS = ("SLURM_CONF", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "LONGRUN_BUCKET")


@dag(dag_id="smoke", schedule=None, catchup=False, tags=["longrun", "smoke"])
def smoke() -> None:
    @task
    def hello() -> list[str]:
        seen = [name for name in STACK_VARS if os.environ.get(name)]
        print(f"longrun smoke: stack variables present: {' '.join(seen) or '(none)'}")
        print(f"longrun smoke: torch imported before the task: {'yes' if 'torch' in sys.modules else 'no'}")
        return seen

    hello()


smoke()
