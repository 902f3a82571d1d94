"""Airflow provider metadata for longrun: registers the `slurm` connection type.

Airflow finds this through the `apache_airflow_provider` entry point in pyproject.toml. It must import
nothing heavy: Airflow calls it while it is still configuring itself.
"""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    """Return the provider description Airflow's providers manager reads."""
    return {
        "package-name": "longrun",
        "name": "longrun",
        "description": "Slurm access and SDC incident handling for long distributed training runs.",
        "versions": ["0.1.0"],
        "connection-types": [
            {
                "connection-type": "slurm",
                "hook-class-name": "longrun.hooks.slurm.SlurmHook",
                "hook-name": "Slurm (longrun)",
                "ui-field-behaviour": {
                    "hidden-fields": ["host", "schema", "port", "login", "password"],
                    "relabeling": {},
                    "placeholders": {
                        "extra": '{"slurm_conf": "/path/to/slurm.conf", "backend": "auto"}',
                    },
                },
            }
        ],
        "hooks": [{"integration-name": "Slurm", "python-modules": ["longrun.hooks.slurm"]}],
        "operators": [{"integration-name": "Slurm", "python-modules": ["longrun.operators.slurm"]}],
        "sensors": [{"integration-name": "Slurm", "python-modules": ["longrun.sensors.slurm"]}],
        "triggers": [{"integration-name": "Slurm", "python-modules": ["longrun.triggers.slurm"]}],
        "integrations": [{"integration-name": "Slurm", "external-doc-url": "https://slurm.schedmd.com/"}],
    }
