"""`make demo` (`python -m longrun.demo`): the whole story on the local stack, told as it happens.

1. `longrun stack up`: Slurm n1..n4, SeaweedFS S3, Airflow (reused when already up).
2. A clean 3-node run (reused when this config already ran clean): the reference fingerprint.
3. The same run with a sick-node drill on n2 from step 17, triggered through Airflow's REST API:
   the recompute audit names n2 -> sdc_incident drains it with longrun's reason -> the replay probe fails
   on it in a MAINT reservation -> the run relaunches on n1, n3 and the spare n4 from the pre-incident
   checkpoint -> it completes.
4. The summary: detection step, lost steps, alert -> relaunched RUNNING, final fingerprint vs the clean
   run's; then the Airflow UI's URL and login. The stack stays up (`longrun stack down` stops it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

from longrun.airflow_rest import AirflowApiError
from longrun.drill import DRILL_CONF, DrillError, Rest, prepare, return_to_service, run_drill
from longrun.slurm.factory import make_client
from longrun.stack.layout import DEFAULT_JOB_USER
from longrun.stack.stack import Stack
from training.records import schema
from training.store.factory import store_from_env
from training.store.interface import NotFound, get_json


def say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Bring the stack up, run (or reuse) the clean reference run, run the drill, and print the summary.

    Why one function: it is the demo's script, its numbered sections printed in the order they run and
    sharing the stack's environment, client and store; it reads top to bottom as the demo does."""
    p = argparse.ArgumentParser(prog="python -m longrun.demo", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--kind", default="sick-node", choices=("sick-node", "weight-flip", "nan"), help="the drill"
    )
    p.add_argument("--step", type=int, default=17, help="the step the fault starts at")
    args = p.parse_args(argv)

    say("== 1. the local stack (Slurm n1..n4, SeaweedFS S3, Airflow)")
    stack = Stack(default_job_user=DEFAULT_JOB_USER)  # jobs as `longrun-job`, as `longrun stack up`
    stack.up(say=say)
    os.environ.update(stack.env())
    env = stack.env()
    rest = Rest.from_env(env)
    prepare(rest)
    client = make_client(backend="cli", slurm_conf=env["SLURM_CONF"])
    return_to_service(client, say)
    store = store_from_env()

    say("\n== 2. the clean reference run")
    tag = hashlib.sha256(json.dumps(DRILL_CONF, sort_keys=True).encode()).hexdigest()[:8]
    clean_run = f"demo-clean-{tag}"
    try:
        clean_fp = get_json(store, schema.store_key(clean_run, schema.REPORT_PATH))["final_fingerprint"]
        say(f"reusing clean run {clean_run}: final fingerprint {clean_fp}")
    except NotFound:
        clean = run_drill(rest, store, {**DRILL_CONF, "run_name": clean_run}, say=say)
        clean_fp = clean.final_fingerprint
        say(clean.summary())

    say(f"\n== 3. the drill: {args.kind} from step {args.step}")
    target = "n2" if args.kind == "sick-node" else "1"
    run = f"demo-{args.kind}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        result = run_drill(
            rest,
            store,
            {
                **DRILL_CONF,
                "run_name": run,
                "drill": {"kind": args.kind, "step": args.step, "target": target},
            },
            say=say,
        )
    except (DrillError, AirflowApiError) as e:
        say(f"\nTHE DRILL DID NOT COMPLETE: {e}")
        say(
            f"Airflow UI: {env['LONGRUN_AIRFLOW_URL']} (user {env['LONGRUN_AIRFLOW_USER']}, password {env['LONGRUN_AIRFLOW_PASSWORD']})"
        )
        return 1

    say("\n== 4. summary")
    say(result.summary())
    same = result.final_fingerprint == clean_fp
    say(
        f"\ndetection step {result.detection_step}; lost steps {result.lost_steps}; "
        f"alert -> relaunched RUNNING {result.recover_s} s"
    )
    say(
        f"final fingerprint {result.final_fingerprint} vs clean run {clean_fp}: {'IDENTICAL' if same else 'DIFFERENT'}"
    )
    node = result.incident.attribution.node if result.incident else None
    if node:
        say(f"{node} stays drained: {client.node(node).reason} (runbooks/diagnostic-failed.md)")
    say(
        f"\nAirflow UI: {env['LONGRUN_AIRFLOW_URL']}  user {env['LONGRUN_AIRFLOW_USER']}  password "
        f"{env['LONGRUN_AIRFLOW_PASSWORD']}\n(the stack stays up; `longrun stack down` stops it)"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
