"""After the monitor, `hand_over` and `finish` both start; each skips itself unless the monitor's outcome is
its own, so an alert reaches sdc_incident without a branch task in between. Neither may act on the other's
outcome, and a result with no known outcome fails instead of being taken for either."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
from longrun.monitor.handover import HandOverOperator
from longrun.monitor.operator import ALERTED, COMPLETED
from longrun.tasks.training_run import finish_task


class _TI:
    """Only what HandOverOperator.execute reads before it decides to skip (no Airflow run is needed)."""

    def __init__(self, result: Any) -> None:
        self.result = result

    def xcom_pull(self, task_ids: str) -> Any:
        assert task_ids == "monitor"
        return self.result


@pytest.mark.parametrize("result", [{"outcome": COMPLETED, "run": "r"}, None, {"run": "r"}, "alert"])
def test_hand_over_skips_without_an_alert(result):
    op = HandOverOperator(task_id="hand_over")
    with pytest.raises(AirflowSkipException):
        op.execute({"ti": _TI(result), "params": {}})
    assert op.trigger_run_id is None  # nothing was prepared for a trigger


def test_finish_skips_after_an_alert():
    with pytest.raises(AirflowSkipException):
        finish_task({"outcome": ALERTED, "run": "r", "alert_key": "runs/r/alerts/x.json"}, {})


@pytest.mark.parametrize("outcome", [None, "", "failed", "ALERT"])
def test_finish_fails_on_an_unknown_outcome(outcome):
    with pytest.raises(AirflowFailException, match="no known outcome"):
        finish_task({"outcome": outcome, "run": "r"}, {})
