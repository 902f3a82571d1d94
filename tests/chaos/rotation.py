"""Which cells of the fault matrix a commit runs under LONGRUN_CHAOS=rotate (tests/chaos/conftest.py).

PER_COMMIT = 2 cells a commit: the 70 cells fall into 35 slots, slot i holding grid cells i and i + 35
(tests/chaos/grid.py GRID: the same component at two steps five apart). A commit runs the slot of its
index modulo 35, so a full rotation takes 35 commits. Two cells (each a drill of a few minutes, after the
clean reference run the session runs once) is what the suite's budget can hold beside the rest; one cell a
commit would halve that and double the rotation to 70 commits.

The index is the commit's position in its history, `git rev-list --count HEAD`: on a line of commits
consecutive commits take consecutive slots, so every cell runs exactly once in any 35 consecutive commits.
A commit hash modulo 35 would choose uniformly at random: a cell would wait 35 commits on average, but
seeing all 70 would take about 150 commits (the coupon collector) and a cell could go 100 commits unrun.
In a shallow clone the count is only the clone's depth, so there the hash's first 12 hex digits are the
index instead (said so in the skip reason).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from .grid import GRID

PER_COMMIT = 2


def slots(per_commit: int = PER_COMMIT) -> int:
    """How many commits a full rotation takes."""
    return -(-len(GRID) // per_commit)


def cells_for(index: int, per_commit: int = PER_COMMIT) -> list[tuple[str, str]]:
    """The cells of rotation `index`: grid cells s, s + n, s + 2n, ... with n = slots(), s = index mod n."""
    n = slots(per_commit)
    return list(GRID[index % n :: n])


def commit_index(root: Path) -> tuple[int, str]:
    """The rotation index of `root`'s HEAD and how it was found (raises CalledProcessError without git)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], check=True, capture_output=True, text=True, timeout=60
        ).stdout.strip()

    head = git("rev-parse", "HEAD")
    if git("rev-parse", "--is-shallow-repository") == "true":
        return int(head[:12], 16), f"hash {head[:12]} (a shallow clone: no commit count)"
    count = int(git("rev-list", "--count", "HEAD"))
    return count, f"commit count {count} of {head[:12]}"
