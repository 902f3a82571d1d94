"""The fault matrix's bookkeeping, without a stack (seconds): a cell's artefact (tests/chaos/artefact.py),
the "missed" rule (a kill that lands after a later step began never counts as ok, read by the harness's own
step recognition), the slurmd a slurmd cell kills, the rotation LONGRUN_CHAOS=rotate runs, and the table
generated from the artefacts (tests/chaos/table.py). Git runs for real, on repositories made here; the
store is a real local-directory store; no Slurm client is needed by the steps looked at here."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from training.records import schema
from training.store.local import LocalDirStore

from . import conftest, grid, rotation, table
from .artefact import CELLS_REL, CellArtefact, Moment, commit_id, load_all, outcome_of
from .harness import Allocation, Where, at_kill, begun, choose_slurmd, next_steps_begun


def _artefact(**kw: Any) -> CellArtefact:
    base: dict[str, Any] = {
        "database": "sqlite",
        "step": "drain",
        "component": "task",
        "run": "chaos1-drain-task",
        "commit": "0123456789abcdef0123456789abcdef01234567",
        "drill": {"kind": "sick-node", "step": 17, "target": "n2"},
        "drill_started": 1000.0,
    }
    return CellArtefact(**{**base, **kw})


# --- the artefact ---


def test_the_artefact_has_every_field_under_its_cells_name(tmp_path: Path) -> None:
    art = _artefact()
    art.killed = {"pid": 4242, "name": "sdc_incident.drain", "node": None, "node_why": None}
    art.step_reached = Moment.at(1030.5, art.drill_started)
    art.kill_landed = Moment.at(1031.25, art.drill_started)
    art.next_steps = {"diagnose": False, "pick": False}
    art.next_step_begun = begun(art.next_steps)
    art.verdict = "fail"
    art.jobs = [{"job_id": 13001, "nodes": ["n1", "n2", "n3"], "active": False}]
    art.drains = [{"incident_id": "i1", "node": "n2", "run": art.run, "time": 1031.0}]
    art.final_fingerprint = "abc"
    path = art.write(passed=True, directory=tmp_path)
    assert path.name == "sqlite--drain--task.json"
    got = json.loads(path.read_text())
    assert got["outcome"] == "ok"
    assert got["kill_landed"] == {"time": 1031.25, "since_start_s": 31.25}
    assert got["step_reached"]["since_start_s"] == 30.5
    for key in ("commit", "database", "step", "component", "killed", "next_step_begun", "verdict", "jobs"):
        assert key in got, key
    assert got["drains"][0]["node"] == "n2" and got["final_fingerprint"] == "abc"
    assert load_all(tmp_path) == [got]


def test_a_failed_cell_writes_its_artefact_too(tmp_path: Path) -> None:
    art = _artefact(error="AssertionError: final weights differ from a clean run")
    path = art.write(passed=False, directory=tmp_path)
    got = json.loads(path.read_text())
    assert got["outcome"] == "failed" and "weights differ" in got["error"]


def test_missed_is_never_ok(tmp_path: Path) -> None:
    assert outcome_of(passed=True, next_step_begun=True) == "missed"
    assert outcome_of(passed=True, next_step_begun=False) == "ok"
    assert outcome_of(passed=True, next_step_begun=None) == "ok"  # unknown: the table says "window not seen"
    assert outcome_of(passed=False, next_step_begun=True) == "failed"  # a failure is never hidden as a miss
    art = _artefact(next_steps={"diagnose": False, "pick": True})
    art.next_step_begun = begun(art.next_steps)
    assert json.loads(art.write(passed=True, directory=tmp_path).read_text())["outcome"] == "missed"


def _git(root: Path, *args: str) -> str:
    cmd = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def _repo(tmp_path: Path, commits: int = 1) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    for i in range(commits):
        (root / "f.txt").write_text(str(i))
        _git(root, "add", "f.txt")
        _git(root, "commit", "-q", "-m", f"c{i}")
    return root


def test_the_commit_says_dirty_except_for_the_artefacts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LONGRUN_CHAOS_COMMIT", raising=False)
    root = _repo(tmp_path)
    head = _git(root, "rev-parse", "HEAD")
    assert commit_id(root) == head
    (root / CELLS_REL).mkdir(parents=True)
    (root / CELLS_REL / "sqlite--drain--task.json").write_text("{}")  # an earlier cell of the session
    assert commit_id(root) == head
    (root / "f.txt").write_text("changed")
    assert commit_id(root) == head + "+dirty"
    assert commit_id(tmp_path / "no-repo") == "unknown"


# --- the "missed" rule, by the harness's own step recognition ---


def test_a_later_step_seen_by_the_harness_makes_the_kill_missed(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "store")
    w = Where(run="r1", store=store, client=None, db=None)  # type: ignore[arg-type]  # store-only steps
    assert grid.NEXT["monitor"] == ("hand_over",) and grid.NEXT["hand_over"] == ("freeze",)
    assert next_steps_begun(w, "monitor") == {"hand_over": False}
    store.put_bytes(schema.store_key("r1", schema.alert_path(17, "finite", "x")), b"{}")
    assert next_steps_begun(w, "monitor") == {"hand_over": True}  # the alert: hand-over has begun
    assert next_steps_begun(w, "hand_over") == {"freeze": False}
    store.put_bytes(schema.store_key("r1", "incidents/i1.json"), b"{}")
    assert begun(next_steps_begun(w, "hand_over")) is True
    assert next_steps_begun(w, "diagnose") == {}  # nothing recognised waits for the diagnosis
    assert begun({}) is None


def test_a_look_that_fails_is_unknown_not_not_begun() -> None:
    w = Where(run="r1", store=None, client=None, db=None)  # type: ignore[arg-type]  # every look raises
    assert next_steps_begun(w, "monitor") == {"hand_over": None}
    assert begun({"diagnose": None, "pick": False}) is None
    assert begun({"diagnose": None, "pick": True}) is True
    # before the kill: begun there means begun at the kill; not begun there proves nothing
    assert at_kill({"pick": True}, {"pick": None}) == {"pick": True}
    assert at_kill({"pick": False}, {"pick": None}) == {"pick": None}
    assert at_kill({"pick": False}, {"pick": False}) == {"pick": False}


# --- the slurmd a slurmd cell kills ---


def test_the_slurmd_killed_holds_a_rank_of_the_run() -> None:
    first = Allocation(job_id=1, nodes=("n1", "n2", "n3"), active=True)
    assert choose_slurmd([first], target="n2") == ("n1", "allocation of job 1 (running): n1,n2,n3")
    relaunch = Allocation(job_id=2, nodes=("n3", "n4", "n1"), active=True)
    assert (
        choose_slurmd([Allocation(job_id=1, nodes=first.nodes, active=False), relaunch], target="n2")[0]
        == "n1"
    )
    older = Allocation(job_id=1, nodes=("n2", "n3", "n4"), active=True)  # the newest running job counts
    assert choose_slurmd([older, relaunch], target="n2")[0] == "n1"
    node, why = choose_slurmd([Allocation(job_id=1, nodes=("n2",), active=True)], target="n2")
    assert node == "n2" and "only the target" in why
    between = [Allocation(job_id=1, nodes=("n2", "n3", "n4"), active=False)]
    node, why = choose_slurmd(between, target="n2")
    assert node == "n3" and "none running" in why
    assert choose_slurmd([], target="n2")[0] == "n1"


# --- the rotation ---


def test_35_consecutive_commits_run_every_cell_once() -> None:
    assert rotation.slots() == 35
    seen = [cell for i in range(1000, 1035) for cell in rotation.cells_for(i)]
    assert sorted(seen) == sorted(grid.GRID) and len(seen) == 70
    assert all(len(rotation.cells_for(i)) == 2 for i in range(35))
    assert rotation.cells_for(7) == rotation.cells_for(7 + 35)


def test_the_rotation_index_is_the_commit_count(tmp_path: Path) -> None:
    root = _repo(tmp_path, commits=3)
    index, how = rotation.commit_index(root)
    assert index == 3 and "commit count 3" in how


def test_rotate_runs_only_this_commits_cells(tmp_path: Path) -> None:
    cells: list[tuple[str, str] | None] = [*grid.GRID, *grid.SPARE_GRID, None]  # None: not a cell
    assert conftest.rotation_skips("1", cells)[0] == [False] * len(cells)
    skipped, why = conftest.rotation_skips(None, cells)
    assert all(skipped) and "LONGRUN_CHAOS=1" in why
    root = _repo(tmp_path, commits=4)
    skipped, why = conftest.rotation_skips("rotate", cells, root)
    assert [c for c, off in zip(cells, skipped, strict=True) if not off] == rotation.cells_for(4)
    assert "commit count 4" in why
    with pytest.raises(subprocess.CalledProcessError):  # no commit: an error, not an empty rotation
        conftest.rotation_skips("rotate", cells, tmp_path / "no-repo")


# --- the table ---


def test_the_table_names_each_cells_commit_and_the_cells_not_run(tmp_path: Path) -> None:
    ok = _artefact(commit="abcdef0123456789+dirty")
    ok.write(passed=True, directory=tmp_path)
    missed = _artefact(step="freeze", component="slurmd", next_steps={"diagnose": False, "pick": True})
    missed.next_step_begun = True
    missed.killed = {"pid": 1, "name": "slurmd-n3", "node": "n3", "node_why": "..."}
    missed.write(passed=True, directory=tmp_path)
    _artefact(step="spare_directive", component="s3").write(passed=False, directory=tmp_path)
    text = table.render(load_all(tmp_path))
    sqlite, postgres = text.split("**PostgreSQL**")
    assert "2 of 70 cells have an artefact (1 ok, 1 missed, 0 failed); 68 not run" in sqlite
    assert "0 of 70 cells have an artefact" in postgres and postgres.count(table.NOT_RUN) == 70 + 7 + 1
    assert "| ok (`abcdef0+dirty`) |" in sqlite.split("| drain |")[1].splitlines()[0]
    assert "missed (on n3; pick had begun; `0123456`)" in sqlite
    spare_row = sqlite.split("| hot spare: directive written |")[1].splitlines()[0]
    assert spare_row.rstrip(" |").endswith("FAILED (`0123456`)") and "1 of 7 run" in sqlite


def test_only_the_marked_section_is_replaced() -> None:
    page = f"history before\n{table.BEGIN}\nold table\n{table.END}\nhistory after\n"
    assert (
        table.replace_section(page, "new\n")
        == f"history before\n{table.BEGIN}\nnew\n{table.END}\nhistory after\n"
    )
    with pytest.raises(ValueError, match="marker"):
        table.replace_section("no markers\n", "new\n")
