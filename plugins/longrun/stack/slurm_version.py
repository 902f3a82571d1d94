"""Which Slurm is installed, and what that version needs in its config.

Debian 12 ships 22.05, Debian 13 ships 24.11. Known differences for the local stack:
- 24.05+ reads `cgroup.conf` even with proctrack/linuxproc and fails without cgroups unless
  `CgroupPlugin=disabled`; 22.05 rejects that value. So the file is written only from 24.05 on.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

_VERSION_RE = re.compile(r"\b(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class SlurmVersion:
    """A Slurm release number, e.g. 22.05.8."""

    major: int
    """Year part, e.g. 22."""
    minor: int
    """Month part, e.g. 5."""
    micro: int = 0
    """Maintenance release."""

    def __post_init__(self) -> None:
        for field in ("major", "minor", "micro"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{field} must be a non-negative int, got {value!r}")

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.micro}"

    @property
    def needs_cgroup_conf(self) -> bool:
        """24.05+ needs cgroup.conf with `CgroupPlugin=disabled` on a host without cgroup setup."""
        return (self.major, self.minor) >= (24, 5)


def parse_version(text: str) -> SlurmVersion:
    """Parse the output of `slurmctld -V` (`slurm-wlm 22.05.8`, `slurm 24.11.5`, ...)."""
    match = _VERSION_RE.search(text)
    if not match:
        raise ValueError(f"slurm version: no version number in {text.strip()!r}")
    major, minor, micro = match.groups()
    return SlurmVersion(major=int(major), minor=int(minor), micro=int(micro or 0))


def detect_version(slurmctld: str = "slurmctld") -> SlurmVersion:
    """Ask the installed slurmctld for its version."""
    out = subprocess.run([slurmctld, "-V"], capture_output=True, text=True, timeout=10, check=True)
    return parse_version(out.stdout or out.stderr)
