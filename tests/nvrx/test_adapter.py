"""training.nvrx without ft_launcher: version capabilities, the no-op monitor, the launch verdict."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from training import launch_records
from training.events import write_durably
from training.nvrx import adapter as nvrx
from training.records import schema
from training.store.interface import put_json
from training.store.local import LocalDirStore


def test_version_parsing() -> None:
    assert nvrx.parse_version("0.4.1") == (0, 4, 1)
    assert nvrx.parse_version("0.7.0rc2+cu12") == (0, 7, 0)
    assert nvrx.parse_version("1.0") == (1, 0, 0)
    with pytest.raises(ValueError, match="'dev'"):
        nvrx.parse_version("dev")


def test_capabilities_by_version() -> None:
    old = nvrx.capabilities("0.4.1")
    assert old.tested and old.workload_control and not old.native_no_restart_exit
    assert old.straggler_module == "nvidia_resiliency_ext.straggler"
    mid = nvrx.capabilities("0.5.0")
    assert mid.native_no_restart_exit and not mid.nvml_health_checks and not mid.tested
    new = nvrx.capabilities("0.7.1")
    assert new.nvml_health_checks and new.straggler_module == "nvidia_resiliency_ext.attribution.straggler"
    assert not nvrx.capabilities("").installed


def test_installed_version_is_the_tested_one() -> None:
    assert nvrx.capabilities().version in nvrx.TESTED_VERSIONS


def test_monitor_is_a_noop_off_ft_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(nvrx.RANK_MONITOR_ENV, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    m = nvrx.NvrxMonitor.from_env()
    m.start()
    for step in range(1, 4):
        m.step_done(step, saved=True, audited=True)
    assert not m.active and m.heartbeats == 0 and m.timeouts_calculated_at is None
    assert m.request_shutdown("sdc verdict") is False
    assert m.info() == {
        "active": False,
        "version": "",
        "restart_count": 2,
        "timeouts_calculated_at": None,
    }
    m.close()


def test_under_ft_launcher_reads_the_rank_monitor_socket() -> None:
    assert nvrx.under_ft_launcher({nvrx.RANK_MONITOR_ENV: "/tmp/x.socket"})
    assert not nvrx.under_ft_launcher({})
    with pytest.raises(ValueError, match="TORCHELASTIC_RESTART_COUNT"):
        nvrx.local_restart_count({"TORCHELASTIC_RESTART_COUNT": "x"})


def _alert(step: int, t: float) -> dict:
    return schema.record(
        "alert",
        run="r",
        step=step,
        check="finite",
        suspect_ranks=[1],
        suspect_nodes=["n2"],
        evidence={},
        time=t,
    )


def test_alerts_since_counts_only_this_launch(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    now = time.time()
    write_durably(run_dir / schema.alert_path(5, "finite", "old"), _alert(5, now - 3600))
    assert launch_records.alerts_since(run_dir, now) == []
    write_durably(run_dir / schema.alert_path(9, "finite", "new"), _alert(9, now + 1))
    (run_dir / "alerts" / "00000010-finite-torn.json").write_text("{not json")
    found = launch_records.alerts_since(run_dir, now)
    assert len(found) == 1 and found[0].endswith("00000009-finite-new.json")


def test_alerts_since_reads_the_store(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "store")
    now = time.time()
    put_json(store, schema.store_key("r", schema.alert_path(7, "finite", "x")), _alert(7, now + 1))
    assert launch_records.alerts_since(tmp_path / "nothing", now) == []
    assert launch_records.alerts_since(tmp_path / "nothing", now, run="r", store=store) == [
        "runs/r/alerts/00000007-finite-x.json"
    ]


def test_launch_verdict_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "r"
    now = time.time()
    assert nvrx.main(["launch-verdict", "--run-dir", str(run_dir), "--since", str(now)]) == 1
    write_durably(run_dir / schema.alert_path(3, "finite", "a"), _alert(3, now))
    assert nvrx.main(["launch-verdict", "--run-dir", str(run_dir), "--since", str(int(now))]) == 0
    assert "alert:" in capsys.readouterr().out
    assert nvrx.main(["version"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == nvrx.capabilities().version


def test_restarts_since_reads_this_launchs_progress(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    now = time.time()
    assert launch_records.restarts_since(run_dir, now) is None
    progress = schema.record(
        "progress", run="r", step=3, loss=1.0, step_time_s=0.1, time=now, restart_count=2
    )
    write_durably(run_dir / schema.PROGRESS_PATH, progress)
    assert launch_records.restarts_since(run_dir, now - 1) == 2
    assert launch_records.restarts_since(run_dir, now + 60) is None  # an earlier launch's record
    write_durably(run_dir / schema.PROGRESS_PATH, {**progress, "restart_count": "2"})
    assert launch_records.restarts_since(run_dir, now - 1) is None  # a count that does not read is no count
    write_durably(run_dir / schema.PROGRESS_PATH, {**progress, "restart_count": None})
    assert launch_records.restarts_since(run_dir, now - 1) is None
