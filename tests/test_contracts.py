"""The public interface (docs/contracts.md), pinned.

Users, runbooks and outside tests depend on these names. This file fails when one of them changes, and
also when the surface grows by accident: every set is compared with an explicit expected set, and the
extras the code has beyond the contract are listed here by name. Growing the surface on purpose means
editing docs/contracts.md and this file together; the last section checks that the two agree.

Fast on purpose: no stack, no scheduler. Airflow and the trainer run in subprocesses (a DagBag over
dags/, `python -m training.train --help`, the import check); the rest runs in-process.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from longrun import entrypoint
from longrun.cli import main as longrun_main
from longrun.monitor import lifecycle

from training.faults import Fault, parse_fault
from training.records import schema

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
TIMEOUT_S = 180  # generous: a busy 2-core machine; idle, each subprocess takes a few seconds

# ---- DAGs ----------------------------------------------------------------------------------------------

CONTRACT_DAG_IDS = {"training_run", "sdc_incident", "checkpoint_audit", "node_return"}
# Not contracted, present in dags/: example and smoke DAGs (system tests of the operators).
EXTRA_DAG_IDS = {"example_slurm_job", "example_slurm_job_fails", "smoke"}

CONTRACT_PARAMS = {
    "run_name",
    "nodes",
    "spare_nodes",
    "gpus_per_node",
    "partition",
    "model",
    "entrypoint",
    "entrypoint_args",
    "job_python",
    "steps",
    "checkpoint_every",
    "recompute_every",
    "vote_every",
    "incident_mode",
    "drill",
}
# Not contracted: set by sdc_incident when it triggers a relaunch (form section "Relaunch ... leave as
# is"). Users never fill them in; they may change with the incident DAG, but not by accident.
EXTRA_PARAMS = {"attach_job_id", "resume_from", "exclude", "attempt", "incident_id"}
# Added beside the pinned Params for sharded training (issue 29): contracted in docs/contracts.md too.
SHARDING_PARAMS = {"ranks_per_node", "parallelism"}

# Parse dags/ with a DagBag in a throwaway AIRFLOW_HOME; write what the contract needs as JSON to argv[1].
# A subprocess keeps Airflow (and its config, read once per process) out of this test process.
_DAGBAG_SCRIPT = """
import json, sys
from airflow.dag_processing.dagbag import DagBag

bag = DagBag(dag_folder=sys.argv[2])
dag = bag.dags.get("training_run")
params = {}
if dag is not None:
    for name in dag.params:
        p = dag.params.get_param(name)
        params[name] = {"schema": p.schema, "default": p.value}
inc = bag.dags.get("sdc_incident")
out = {"dag_ids": sorted(bag.dag_ids), "import_errors": {str(k): str(v) for k, v in bag.import_errors.items()},
       "params": params, "incident_params": sorted(inc.params) if inc is not None else []}
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
"""


@pytest.fixture(scope="module")
def dagbag(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("contracts-dagbag")
    out = tmp / "dagbag.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(AIRFLOW_HOME=str(tmp / "airflow"), AIRFLOW__CORE__LOAD_EXAMPLES="False")
    proc = subprocess.run(
        [sys.executable, "-c", _DAGBAG_SCRIPT, str(out), str(REPO / "dags")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
        cwd=tmp,
    )
    assert proc.returncode == 0, f"DagBag over dags/ failed:\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text())


def test_sdc_incident_params_are_closed(dagbag: dict[str, Any]) -> None:
    assert set(lifecycle.INCIDENT_PARAMS) == set(dagbag["incident_params"])


def test_dag_ids(dagbag: dict[str, Any]) -> None:
    assert dagbag["import_errors"] == {}
    assert set(dagbag["dag_ids"]) == CONTRACT_DAG_IDS | EXTRA_DAG_IDS


def schemas_enum(params: dict[str, Any], name: str) -> list[str]:
    return list(params[name]["schema"]["enum"])


def test_training_run_params(dagbag: dict[str, Any]) -> None:
    params = dagbag["params"]
    assert set(params) == CONTRACT_PARAMS | EXTRA_PARAMS | SHARDING_PARAMS
    assert params["parallelism"]["default"] == "ddp" and schemas_enum(params, "parallelism") == [
        "ddp",
        "fsdp",
        "hsdp",
    ]
    assert params["ranks_per_node"]["default"] == 0
    # Closed conf: what preflight and an incident's run_params accept is exactly what the DAG declares.
    assert set(lifecycle.RUN_PARAMS) == set(params)
    schemas = {name: p["schema"] for name, p in params.items()}
    assert schemas["incident_mode"]["enum"] == ["act", "approve", "observe"]
    assert params["incident_mode"]["default"] == "act"
    assert "tiny" in schemas["model"]["enum"]
    assert schemas["gpus_per_node"]["minimum"] == 0, "gpus_per_node: 0 means CPU ranks"
    drill = schemas["drill"]
    assert set(drill["type"]) == {"null", "object"}
    assert params["drill"]["default"] is None
    assert set(drill["properties"]) == {"kind", "step", "target"}
    assert set(drill["required"]) == {"kind", "step", "target"}
    assert set(drill["properties"]["kind"]["enum"]) == CONTRACT_FAULT_KINDS | EXTRA_FAULT_KINDS
    assert params["entrypoint"]["default"] == "module:training.train"
    assert schemas["entrypoint"]["pattern"] == entrypoint.ENTRYPOINT_PATTERN
    # null too: Airflow's form submits an emptied field as null, and a schema that refuses it keeps Trigger disabled
    assert params["entrypoint_args"]["default"] == [] and schemas["entrypoint_args"]["type"] == [
        "null",
        "array",
    ]
    assert schemas["entrypoint_args"]["maxItems"] == entrypoint.MAX_ARGS
    assert schemas["entrypoint_args"]["items"]["pattern"] == entrypoint.ARG_PATTERN
    assert params["job_python"]["default"] is None and schemas["job_python"]["type"] == ["null", "string"]


# ---- longrun stack ------------------------------------------------------------------------------------

CONTRACT_STACK_COMMANDS = {"up", "down", "status", "env"}
CONTRACT_ENV = {
    "SLURM_CONF",
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "LONGRUN_BUCKET",
    "LONGRUN_AIRFLOW_URL",
    "LONGRUN_AIRFLOW_USER",
    "LONGRUN_AIRFLOW_PASSWORD",
}
# Not in the pinned list: boto3 needs a region for SeaweedFS's S3 (`AWS_DEFAULT_REGION`), and `airflow ...`
# commands in a shell must see the stack's config (`AIRFLOW_HOME`). The store's two sides
# (docs/security.md): the orchestrator's bucket, the shared job identity's keys and the switch to per-run
# job identities (`LONGRUN_RUN_IDENTITIES`). The run dirs' root: the stack's workers put run dirs there,
# and a shell that looks at them must see the same one.
EXTRA_ENV = {
    "AWS_DEFAULT_REGION",
    "AIRFLOW_HOME",
    "LONGRUN_RUN_ROOT",
    "LONGRUN_ORCH_BUCKET",
    "LONGRUN_JOB_ACCESS_KEY_ID",
    "LONGRUN_JOB_SECRET_ACCESS_KEY",
    "LONGRUN_RUN_IDENTITIES",
}


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """`longrun ARGV --help` through the console script's own entry function."""
    with pytest.raises(SystemExit) as exc:
        longrun_main([*argv, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def _choices(help_text: str) -> set[str]:
    """The subcommands argparse lists as `{a,b,c}` in a usage line."""
    usage = help_text.split("\n\n", 1)[0]
    start, end = usage.index("{"), usage.index("}")
    return {c.strip() for c in usage[start + 1 : end].split(",")}


def test_stack_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    assert _choices(_help(capsys, "stack")) == CONTRACT_STACK_COMMANDS


def test_stack_up_db_option(capsys: pytest.CaptureFixture[str]) -> None:
    """`up --db sqlite|postgres` picks Airflow's metadata database (issue 14); sqlite is the default."""
    text = _help(capsys, "stack", "up")
    assert "--db {sqlite,postgres}" in text, text


def test_stack_env_prints_exactly_the_contracted_exports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`env` on a fresh state dir, no process started: each component reports its client env once its
    files exist, so create them the way `up` would first (generated credentials and password; the Slurm
    config only needs to exist for `env`)."""
    from longrun.stack.layout import NODES, PARTITION
    from longrun.stack.stack import Stack

    assert NODES == ("n1", "n2", "n3", "n4")
    assert PARTITION == "debug"
    stack = Stack(tmp_path / "state")
    stack.s3.credentials()
    stack.airflow.password()
    conf = stack.slurm.paths["conf"]
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.touch()

    assert longrun_main(["stack", "--state-dir", str(stack.state_dir), "env"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith("export ") and "=" in line for line in lines), lines
    names = [line.removeprefix("export ").split("=", 1)[0] for line in lines]
    assert len(names) == len(set(names)), names
    assert set(names) == CONTRACT_ENV | EXTRA_ENV


# ---- longrun checkpoints ------------------------------------------------------------------------------

CONTRACT_CHECKPOINT_COMMANDS = {"list", "validate", "promote", "pick"}
# Not contracted, present: `demote` (mark checkpoints after a known-good step suspect; the incident DAG
# and runbooks use it) and `retention` (keep the last K promoted, delete the rest).
EXTRA_CHECKPOINT_COMMANDS = {"demote", "retention"}


def test_checkpoints_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    found = _choices(_help(capsys, "checkpoints"))
    assert found == CONTRACT_CHECKPOINT_COMMANDS | EXTRA_CHECKPOINT_COMMANDS
    for sub in CONTRACT_CHECKPOINT_COMMANDS:
        assert "--run" in _help(capsys, "checkpoints", sub), f"checkpoints {sub} lacks --run"
    for sub in ("validate", "promote", "pick"):
        assert "--step" in _help(capsys, "checkpoints", sub), f"checkpoints {sub} lacks --step"


# ---- longrun nodes -------------------------------------------------------------------------------------

CONTRACT_NODES_COMMANDS = {"list", "show"}
CONTRACT_INCIDENTS_COMMANDS = {"list", "close"}


def test_nodes_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    assert _choices(_help(capsys, "nodes")) == CONTRACT_NODES_COMMANDS
    assert "node" in _help(capsys, "nodes", "show")
    assert _choices(_help(capsys, "incidents")) == CONTRACT_INCIDENTS_COMMANDS
    for opt in ("--run", "--incident", "--reason", "--by"):
        assert opt in _help(capsys, "incidents", "close")


# ---- the trainer --------------------------------------------------------------------------------------

CONTRACT_TRAIN_FLAGS = (
    "--run-name",
    "--run-dir",
    "--steps",
    "--checkpoint-every",
    "--recompute-every",
    "--vote-every",
    "--fault",
    "--resume-from",
)
CONTRACT_FAULT_KINDS = {"nan", "scale", "weight-flip", "sick-node", "crash", "hang"}
# Accepted beside the original six: `inf` (like nan, an Inf in one rank's gradient).
EXTRA_FAULT_KINDS = {"inf"}


def _trainer_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_train_help_shows_every_contracted_flag() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "training.train", "--help"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=_trainer_env(),
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    words = set(proc.stdout.replace("[", " ").replace("]", " ").split())
    missing = [f for f in CONTRACT_TRAIN_FLAGS if f not in words]
    assert not missing, f"`python -m training.train --help` lacks {missing}:\n{proc.stdout}"
    assert "KIND:STEP:TARGET" in proc.stdout


def test_longrun_train_console_script() -> None:
    scripts = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts.get("longrun-train") == "training.train:main"
    assert scripts.get("longrun") == "longrun.cli:main"
    assert shutil.which("longrun-train", path=str(VENV_BIN)), "longrun-train is not installed in the venv"


def test_fault_kinds() -> None:
    assert set(schema.FAULT_KINDS) == CONTRACT_FAULT_KINDS | EXTRA_FAULT_KINDS
    for kind in sorted(CONTRACT_FAULT_KINDS):
        assert parse_fault(f"{kind}:5:1") == Fault(kind=kind, step=5, rank=1)
    assert parse_fault("sick-node:5:n2") == Fault(kind="sick-node", step=5, node="n2")


def test_exit_code_of_an_sdc_verdict() -> None:
    assert schema.EXIT_SDC_VERDICT == 93


def test_training_never_imports_airflow() -> None:
    code = (
        "import sys, training, training.train, training.api, training.api.guard\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('airflow', 'longrun', 'great_expectations', 'matplotlib')))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout


def test_the_base_install_is_the_job_side() -> None:
    """`pip install longrun` (no extra) installs the job side only: what runs on the nodes needs neither
    Airflow nor the audit's or the UI's libraries (those are the `airflow` extra)."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = {re.split(r"[=<>\[ ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    assert base == {"boto3", "torch", "nvidia-resiliency-ext", "numpy", "xxhash"}, base
    airflow = " ".join(project["optional-dependencies"]["airflow"])
    assert "apache-airflow==" in airflow and "great-expectations" in airflow


# ---- records ------------------------------------------------------------------------------------------

CONTRACT_ALERT_FIELDS = (
    "schema_version",
    "run",
    "step",
    "check",
    "suspect_ranks",
    "suspect_nodes",
    "evidence",
)

#: Record kinds that are dataclasses of their own (no row in schema.REQUIRED), registered in
#: training.records.KINDS all the same.
CONTRACT_NEWER_RECORD_KINDS = {
    "segment",
    "fault",
    "directive",
    "node_event",
    "run_claim",
    "security_event",
    "alert_key",
    "incident_lock",
    "incident_join",
    "run_launch",
    "alert_claim",
    "drill_grant",
}


def test_alert_record() -> None:
    assert set(schema.CHECKS) == {"finite", "recompute", "weight_vote"}
    for check in schema.CHECKS:
        alert = schema.record(
            "alert",
            run="demo",
            step=7,
            check=check,
            suspect_ranks=[1],
            suspect_nodes=["n2"],
            evidence={"losses": [1.0, 2.0]},
        )
        assert set(CONTRACT_ALERT_FIELDS) <= set(alert)
        json.dumps(alert)  # a JSON object
    for field in CONTRACT_ALERT_FIELDS:
        broken = {k: v for k, v in alert.items() if k != field}
        with pytest.raises(schema.SchemaError):
            schema.validate("alert", broken)
    with pytest.raises(schema.SchemaError, match="check"):
        schema.validate("alert", {**alert, "check": "loss_spike"})
    # one JSON object per alert under the run's alerts/
    assert schema.alert_path(7, "finite", "r001-1").startswith("alerts/")
    assert schema.store_key("demo", "alerts/x.json") == "runs/demo/alerts/x.json"


def test_run_report_carries_final_fingerprint() -> None:
    report = schema.record("report", run="demo", final_step=40, final_fingerprint="ab12")
    assert report["final_fingerprint"] == "ab12"
    with pytest.raises(schema.SchemaError, match="final_fingerprint"):
        schema.validate("report", {k: v for k, v in report.items() if k != "final_fingerprint"})
    assert schema.REPORT_PATH == "report.json"


def test_model_presets_include_tiny() -> None:
    assert "tiny" in schema.MODEL_PRESETS
    from training.config import PRESETS

    assert "tiny" in PRESETS


# ---- docs/contracts.md agrees with the code -----------------------------------------------------------

CONTRACTS_MD = REPO / "docs" / "contracts.md"


def _section(title: str) -> str:
    """The text of `## title` in docs/contracts.md, up to the next `## ` heading."""
    text = CONTRACTS_MD.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _table_rows(section: str) -> dict[str, str]:
    """First-column name (in backticks) -> the rest of the row, for the Markdown table rows of `section`."""
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) >= 2:
            rows[cells[0].strip("`").split()[0]] = cells[1]
    return rows


def _ticked(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def test_docs_name_the_dag_ids_and_params() -> None:
    dags = _section("DAGs")
    listed = {name for line in dags.splitlines() if line.startswith("- `") for name in _ticked(line)[:1]}
    assert listed == CONTRACT_DAG_IDS
    assert set(_table_rows(dags)) == CONTRACT_PARAMS | SHARDING_PARAMS
    assert set(_ticked(dags.split("sets ", 1)[1].split("\n\n", 1)[0])) >= EXTRA_PARAMS


#: The job environment (docs/contracts.md "The job's environment"): what any entrypoint reads.
CONTRACT_JOB_ENV = {
    "LONGRUN_RUN_NAME",
    "LONGRUN_RUN_DIR",
    "LONGRUN_STEPS",
    "LONGRUN_CHECKPOINT_EVERY",
    "LONGRUN_RECOMPUTE_EVERY",
    "LONGRUN_VOTE_EVERY",
    "LONGRUN_SEED",
    "LONGRUN_PARALLELISM",
    "LONGRUN_MODEL",
    "LONGRUN_FAULTS",
    "LONGRUN_RESUME_FROM",
    "LONGRUN_AWAIT_DIRECTIVE_S",
}


def test_job_environment() -> None:
    from longrun.launch import JOB_EXPORT

    assert set(entrypoint.JOB_ENV) == CONTRACT_JOB_ENV
    assert not CONTRACT_JOB_ENV & set(JOB_EXPORT), "the job's settings come from the script, never the worker"
    assert set(_table_rows(_section("The job's environment"))) == CONTRACT_JOB_ENV


def test_docs_name_the_commands() -> None:
    commands = _section("Commands")
    stack = re.search(r"`longrun stack ([a-z|]+)", commands)
    checkpoints = re.search(r"`longrun checkpoints ([a-z|]+)", commands)
    assert stack and set(stack.group(1).split("|")) == CONTRACT_STACK_COMMANDS
    assert checkpoints and set(checkpoints.group(1).split("|")) == CONTRACT_CHECKPOINT_COMMANDS
    for extra in EXTRA_CHECKPOINT_COMMANDS:
        assert f"`{extra}`" in commands
    from longrun.cli import JOB_SIDE_SUBCOMMANDS, SUBCOMMANDS

    for name in {**SUBCOMMANDS, **JOB_SIDE_SUBCOMMANDS}:
        assert f"`longrun {name} " in commands, f"docs/contracts.md does not list `longrun {name}`"


def test_docs_name_the_trainer_flags_fault_kinds_and_exit_code() -> None:
    trainer = _section("The trainer")
    assert tuple(_table_rows(trainer)) == CONTRACT_TRAIN_FLAGS
    kinds_line = next(line for line in trainer.splitlines() if line.startswith("Pinned fault kinds"))
    assert set(_ticked(kinds_line)) == set(schema.FAULT_KINDS)
    assert f"**{schema.EXIT_SDC_VERDICT}**" in trainer
    assert "`--run NAME`" in trainer, "the old spelling and where it still works"
    slurm = _section("Slurm")
    assert f"`{schema.DRAIN_PREFIX}`" in slurm


def test_docs_name_the_environment() -> None:
    env = _section("Environment")
    listed = {_ticked(line)[0] for line in env.splitlines() if line.startswith("- `")}
    assert listed == CONTRACT_ENV
    for name in EXTRA_ENV:
        assert f"`{name}`" in env


def test_docs_name_every_record_kind_and_its_required_fields() -> None:
    records_md = _section("Records")
    rows = _table_rows(records_md)
    documented = {kind: set(_ticked(fields)) for kind, fields in rows.items()}
    in_code = {kind: set(fields) for kind, fields in schema.REQUIRED.items()}
    assert documented == in_code
    from training import records

    newer_line = records_md.split("Newer kinds", 1)[1].split("\n\n", 1)[0]
    newer = set(_ticked(newer_line)) & set(records.KINDS)
    assert set(records.KINDS) == set(documented) | newer, "one typed record class per documented kind"
    assert newer == CONTRACT_NEWER_RECORD_KINDS
    assert set(CONTRACT_ALERT_FIELDS) - {"schema_version"} <= documented["alert"]
    layout = _section("Store layout")
    for path in (schema.PROGRESS_PATH, schema.PROMOTED_POINTER_PATH, schema.REPORT_PATH):
        assert path in layout
