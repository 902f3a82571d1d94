"""Where the suite's CPU goes, test by test: the machine's busy CPU-seconds (every process: the test's own,
its trainers, the stack's daemons) and the wall seconds from each test's setup to its teardown.

`make test` on two cores is CPU-bound (the README's paragraph on test time), so the test that costs the
suite the most is the one that burns the most CPU, not the one that waits the longest. Wall-time durations (`--durations`) cannot tell those apart; this can, when the session runs alone
on the machine (busy CPU is system-wide, so anything running beside the session is counted too).

Opt-in: `LONGRUN_TEST_CPU=<file>` appends one JSON line per test (`nodeid`, `wall_s`, `busy_cpu_s`) and
prints the 30 costliest tests and files at the end. A measuring tool, not a test: nothing asserts on it.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

ENV = "LONGRUN_TEST_CPU"
TICKS = os.sysconf("SC_CLK_TCK")


def busy_cpu_s() -> float:
    """CPU-seconds every core has spent busy since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / TICKS


class CpuProfile:
    """The pytest plugin: measures each test's protocol (setup, call, teardown) and writes its line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[dict[str, object]] = []

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
        wall, busy = time.monotonic(), busy_cpu_s()
        try:
            return (yield)
        finally:
            row = {
                "nodeid": item.nodeid,
                "wall_s": round(time.monotonic() - wall, 2),
                "busy_cpu_s": round(busy_cpu_s() - busy, 2),
            }
            self.rows.append(row)
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        tr = terminalreporter
        tr.section(f"busy CPU per test ({ENV}={self.path})")
        by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for row in self.rows:
            totals = by_file[str(row["nodeid"]).split("::")[0]]
            totals[0] += float(row["busy_cpu_s"])  # type: ignore[arg-type]
            totals[1] += float(row["wall_s"])  # type: ignore[arg-type]
        for row in sorted(self.rows, key=lambda r: -float(r["busy_cpu_s"]))[:30]:  # type: ignore[arg-type]
            tr.write_line(f"{row['busy_cpu_s']:8.1f} cpu-s {row['wall_s']:8.1f} s  {row['nodeid']}")
        tr.write_line("per file:")
        for name, (cpu, wall) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:30]:
            tr.write_line(f"{cpu:8.1f} cpu-s {wall:8.1f} s  {name}")


def register(config: pytest.Config) -> None:
    """Registers the plugin when LONGRUN_TEST_CPU names a file."""
    path = os.environ.get(ENV)
    if path:
        config.pluginmanager.register(CpuProfile(Path(path)), "longrun-cpu-profile")
