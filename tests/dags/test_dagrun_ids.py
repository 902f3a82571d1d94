"""The hand-over run ids: the operators that create them and the drill that finds them share one definition."""

from __future__ import annotations

import pytest
from longrun.dagrun_ids import attempt_run_id, incident_run_id


def test_incident_run_id_is_the_alert_stem() -> None:
    key = "runs/r1/alerts/00000017-recompute-r000-1764430000.json"
    assert incident_run_id(key) == "incident__00000017-recompute-r000-1764430000"


@pytest.mark.parametrize("key", ["runs/r1/alerts/", "runs/r1/alerts/.json", "runs/r1/alerts/x.txt"])
def test_incident_run_id_refuses_what_is_not_an_alert_key(key: str) -> None:
    with pytest.raises(ValueError, match="alert_key"):
        incident_run_id(key)


def test_attempt_run_id() -> None:
    assert attempt_run_id("r1", 2) == "r1__attempt2"
