"""Each injected fault is caught by the intended check, names the right rank and node, writes the alert
to the run dir and the store, and ends every rank with exit code 93. Real processes: 4 gloo ranks on
CPU, nodes n1..n4 by LONGRUN_NODE_NAMES."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import REPO, base_env

from training.records.schema import EXIT_SDC_VERDICT

AUDIT = ["--steps", "12", "--recompute-every", "5", "--vote-every", "5"]


def only_alert(run, check: str, step: int) -> dict:
    alerts = run.alerts()
    assert len(alerts) == 1, run.log()
    alert = alerts[0]
    assert (alert["check"], alert["step"]) == (check, step), alert
    assert run.store_alerts("run") == alerts  # the same record in the store
    return alert


def checks_at(run, step: int) -> dict[str, str]:
    return {r["check"]: r["verdict"] for r in run.checks() if r["step"] == step}


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_nonfinite_gradient_is_caught_by_the_finite_check(launch, kind):
    run = launch([*AUDIT, "--fault", f"{kind}:6:1"])
    assert run.rcs == [EXIT_SDC_VERDICT] * 4, run.log()
    alert = only_alert(run, "finite", 6)
    assert alert["suspect_ranks"] == [1] and alert["suspect_nodes"] == ["n2"]
    assert alert["update_applied"] is False
    assert alert["evidence"]["flags_by_rank"] == [0, 1, 0, 0]
    assert "FAULT INJECTION IS ON" in run.logs[1]
    progress = json.loads((run.run_dir / "progress" / "latest.json").read_text())
    assert progress["step"] == 5  # step 6 was never completed


def test_scaled_gradient_passes_finite_and_is_caught_by_recompute(launch):
    run = launch([*AUDIT, "--fault", "scale:10:2"])
    assert run.rcs == [EXIT_SDC_VERDICT] * 4, run.log()
    assert checks_at(run, 10) == {"finite": "pass", "recompute": "fail"}
    alert = only_alert(run, "recompute", 10)
    assert alert["suspect_ranks"] == [2] and alert["suspect_nodes"] == ["n3"]
    pair = alert["evidence"]["pairs"][0]
    assert (pair["checker"], pair["target"]) == (1, 2)
    assert pair["reported"]["loss"] == pair["recomputed"]["loss"]  # the loss was right, the gradient not
    assert pair["reported"]["grad_fingerprint"] != pair["recomputed"]["grad_fingerprint"]
    votes = alert["evidence"]["votes"]["2"]
    assert len({v["grad_fingerprint"] for r, v in votes.items() if r != "2"}) == 1


def test_scaled_gradient_between_audits_is_a_blind_spot(launch):
    # Documented in docs/checks.md: a transient finite fault between audit steps leaves no trace.
    run = launch([*AUDIT, "--fault", "scale:9:2"])
    assert run.rcs == [0] * 4, run.log()
    assert run.alerts() == []


def test_weight_flip_is_caught_by_the_vote_before_the_checkpoint(launch):
    run = launch(["--steps", "12", "--recompute-every", "0", "--vote-every", "0", "--checkpoint-every", "10",
                  "--fault", "weight-flip:7:3"])  # fmt: skip
    assert run.rcs == [EXIT_SDC_VERDICT] * 4, run.log()
    alert = only_alert(run, "weight_vote", 10)
    assert alert["suspect_ranks"] == [3] and alert["suspect_nodes"] == ["n4"]
    assert list(alert["evidence"]["tensors_differing_from_majority"]) == ["3"]
    assert not (run.run_dir / "checkpoints" / "step-00000010").exists()  # never frozen into a checkpoint


def test_sick_node_is_caught_by_recompute_and_seen_by_the_probe(launch, tmp_path):
    run = launch([*AUDIT, "--fault", "sick-node:8:n2"])
    assert run.rcs == [EXIT_SDC_VERDICT] * 4, run.log()
    alert = only_alert(run, "recompute", 10)
    assert alert["suspect_ranks"] == [1] and alert["suspect_nodes"] == ["n2"]
    assert (tmp_path / "fault-state" / "sick-nodes" / "n2").exists()

    def probe(node: str, *extra: str) -> tuple[int, dict]:
        p = subprocess.run(
            [sys.executable, "-m", "training.probe", "--node", node, *extra],
            cwd=REPO, env=base_env(tmp_path, ""), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        return p.returncode, json.loads(p.stdout)

    rc, healthy = probe("n1")
    assert rc == 0 and healthy["verdict"] == "no-reference"
    assert probe("n3", "--expect", healthy["fingerprint"]) == (0, {**healthy, "node": "n3", "verdict": "pass",
                                                                   "expect": healthy["fingerprint"],
                                                                   "duration_s": pytest.approx(0, abs=1e9)})  # fmt: skip
    rc, sick = probe("n2", "--expect", healthy["fingerprint"])
    assert rc == 1 and sick["verdict"] == "fail" and sick["fingerprint"] != healthy["fingerprint"]


def test_two_nodes_report_a_mismatch_without_naming(launch):
    run = launch([*AUDIT, "--fault", "scale:10:2"], nodes="n1,n1,n2,n2")
    assert run.rcs == [EXIT_SDC_VERDICT] * 4, run.log()
    alert = only_alert(run, "recompute", 10)
    assert alert["suspect_ranks"] == [] and alert["suspect_nodes"] == []
    assert alert["evidence"]["offset"] == 2 and alert["evidence"]["attributable"] is False
    assert "3 nodes" in alert["evidence"]["why_unnamed"]


def test_crash_is_not_an_sdc_verdict(launch):
    run = launch(["--steps", "8", "--fault", "crash:4:2"], env={"LONGRUN_HANG_S": "5"})
    assert run.rcs[2] == -9, run.log()
    assert EXIT_SDC_VERDICT not in run.rcs and all(rc != 0 for rc in run.rcs)
    assert run.alerts() == []


def test_an_in_job_restart_after_the_verdict_exits_93_before_any_step(launch):
    """NVRx 0.4.1 can restart the workers before the verdict's shutdown request reaches it (seen in CI: the
    restart replayed the drill and wrote a second alert). Restart 1 of the same launch (ft_launcher's
    TORCHELASTIC_RESTART_COUNT, stood in by the environment here: no ft_launcher) must not train again."""
    t0 = time.time() - 1
    first = launch([*AUDIT, "--fault", "nan:6:1"], env={"LONGRUN_LAUNCH_T0": str(t0)})
    assert first.rcs == [EXIT_SDC_VERDICT] * 4, first.log()
    restarted = {"LONGRUN_LAUNCH_T0": str(t0), "TORCHELASTIC_RESTART_COUNT": "1"}
    again = launch([*AUDIT, "--fault", "nan:6:1"], env=restarted)
    assert again.rcs == [EXIT_SDC_VERDICT] * 4, again.log()
    assert len(again.alerts()) == 1, again.log()  # the first incarnation's only
    progress = json.loads((again.run_dir / "progress" / "latest.json").read_text())
    assert progress["step"] == 5
    # A restart in a later launch (its start after the alert) trains as usual.
    later = launch(AUDIT, env={"LONGRUN_LAUNCH_T0": str(time.time()), "TORCHELASTIC_RESTART_COUNT": "1"})
    assert later.rcs == [0] * 4, later.log()
