"""Running Slurm's commands for the CLI backend: no shell, a timeout, this cluster's config, errors sorted."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path

from longrun.slurm.errors import BackendUnavailableError, SlurmCommandError, SlurmUnavailableError

# stderr fragments that mean "the controller is not reachable right now": worth a retry.
_UNAVAILABLE = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Connection refused",
    "Zero Bytes were transmitted",
    "slurm_load_jobs error: Unable",
    "Slurm backup controller in standby mode",
)


class SlurmCommands:
    """Runs sbatch/squeue/sinfo/scontrol/scancel for one cluster (its slurm.conf); the CLI backend's base."""

    def __init__(self, *, slurm_conf: str | None = None, timeout_s: float = 30.0) -> None:
        self.slurm_conf = slurm_conf or os.environ.get("SLURM_CONF") or None
        self.timeout_s = timeout_s
        if self.slurm_conf and not Path(self.slurm_conf).is_file():
            # Slurm's commands spend ~60 s retrying a missing config before they fail: fail now.
            raise BackendUnavailableError(f"slurm_conf={self.slurm_conf!r}: no such file")

    @cached_property
    def _env(self) -> dict[str, str]:
        # Inherited SLURM_* (say, from an enclosing allocation) would redirect srun/sbatch: keep only the conf.
        env = {k: val for k, val in os.environ.items() if not k.startswith("SLURM_")}
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def _run(
        self,
        argv: list[str],
        *,
        stdin: str | None = None,
        timeout_s: float | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> str:
        try:
            proc = subprocess.run(
                argv,
                input=stdin,
                capture_output=True,
                text=True,
                env={**self._env, **extra_env} if extra_env else self._env,
                timeout=timeout_s or self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as err:
            raise SlurmUnavailableError(
                f"{argv[0]} did not answer within {err.timeout:.0f} s: {argv}"
            ) from err
        except FileNotFoundError as err:
            raise SlurmCommandError(f"{argv[0]} is not installed (PATH={os.environ.get('PATH')})") from err
        if proc.returncode != 0:
            msg = (proc.stderr or proc.stdout).strip()
            if any(s in msg for s in _UNAVAILABLE):
                raise SlurmUnavailableError(f"{' '.join(argv)}: {msg}")
            raise SlurmCommandError(f"{' '.join(argv)} (rc {proc.returncode}): {msg}")
        return proc.stdout

    @cached_property
    def _version(self) -> str:
        return self._run(["sinfo", "--version"]).split()[-1]

    def version(self) -> str:
        return self._version

    @property
    def _has_json(self) -> bool:
        major, minor = (int(x) for x in self.version().split(".")[:2])
        return (major, minor) >= (21, 8)

    @property
    def _json_v2(self) -> bool:
        """23.02+: filters work and the JSON is the newer shape."""
        major, minor = (int(x) for x in self.version().split(".")[:2])
        return (major, minor) >= (23, 2)

    def config(self) -> dict[str, str]:
        """`scontrol show config` as a dict."""
        out = {}
        for line in self._run(["scontrol", "show", "config"]).splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() and " " not in key.strip():
                out[key.strip()] = value.strip()
        return out
