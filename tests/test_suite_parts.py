"""scripts/test.sh runs the suite in parts side by side (helpers.suite_parts): every test must land in
exactly one of them, and every test that needs Airflow must be in the one session that has one."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import suite_parts

TESTS = Path(__file__).resolve().parent


@dataclass
class FakeItem:
    """What select_part reads of a pytest item: its path, its markers and its fixtures."""

    path: Path
    markers: set[str] = field(default_factory=set)
    fixturenames: tuple[str, ...] = ()

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


@dataclass
class FakeConfig:
    deselected: list[FakeItem] = field(default_factory=list)

    @property
    def hook(self) -> FakeConfig:
        return self

    def pytest_deselected(self, items: list[FakeItem]) -> None:
        self.deselected.extend(items)


ITEMS = [
    FakeItem(TESTS / "slurm" / "test_scenarios.py", {"slurm"}),
    FakeItem(TESTS / "slurm" / "test_example_dag.py", {"slurm", "airflow"}),
    FakeItem(TESTS / "e2e" / "test_drill.py", {"slurm", "airflow", "slow"}),
    FakeItem(TESTS / "nvrx" / "test_cluster.py", {"slurm"}),
    FakeItem(TESTS / "test_contracts.py"),
    FakeItem(
        TESTS / "ui" / "test_browser.py", set(), ("local_stack", "airflow_stack")
    ),  # no mark: its fixture
]


def run_part(monkeypatch: pytest.MonkeyPatch, part: str | None) -> tuple[list[FakeItem], list[FakeItem]]:
    if part is None:
        monkeypatch.delenv(suite_parts.PART_ENV, raising=False)
    else:
        monkeypatch.setenv(suite_parts.PART_ENV, part)
    items, config = list(ITEMS), FakeConfig()
    suite_parts.select_part(config, items)  # type: ignore[arg-type]
    return items, config.deselected


def test_the_parts_split_the_suite_without_gap_or_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    parts = {p: run_part(monkeypatch, p)[0] for p in ("slurm", "airflow", "other")}
    assert parts["slurm"] == [ITEMS[0], ITEMS[3]]  # tests/slurm and tests/nvrx without Airflow
    # every test that needs Airflow, by mark or by fixture, tests/slurm's included
    assert parts["airflow"] == [ITEMS[1], ITEMS[2], ITEMS[5]]
    assert parts["other"] == [ITEMS[4]]
    assert sorted(map(ITEMS.index, sum(parts.values(), []))) == list(range(len(ITEMS)))
    rest, rest_dropped = run_part(monkeypatch, "rest")
    assert rest == [i for i in ITEMS if i not in parts["slurm"]] and rest_dropped == parts["slurm"]


def test_unset_runs_everything_and_a_typo_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_part(monkeypatch, None) == (ITEMS, [])
    with pytest.raises(pytest.UsageError, match="LONGRUN_SUITE_PART"):
        run_part(monkeypatch, "slurn")
