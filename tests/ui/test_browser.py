"""The operator's path in a real browser: log into the Airflow UI, trigger `training_run` from its Params
form with a fault drill, see the run start, open its run-health page (the plugin's tab on the DAG run),
and see the drill's incident there: the alert, the incident timeline, the drained node, the runbook.

Headless Chromium from Debian's package, driven by Playwright through its executable path (no browser
download; `make test` installs the package via scripts/setup-system.sh). Everything else is real: the
session's Airflow (scheduler, triggerer, dag-processor, API server with the longrun plugin), Slurm and
SeaweedFS S3. Screenshots go to artifacts/browser/ (git-ignored), kept as the test's artifacts.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.airflow_api import AirflowApi, AirflowApiError

pytestmark = [pytest.mark.browser, pytest.mark.airflow, pytest.mark.slow]

CHROMIUM = Path(os.environ.get("LONGRUN_CHROMIUM", "/usr/bin/chromium"))
# As root, without a sandbox; without the background-networking flags Chromium keeps dialling out
# through a closed network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "browser"
DAG_ID = "training_run"
# Slow on purpose: two busy cores, the API server renders plots and the UI bundle is large.
UI_TIMEOUT_MS = 90_000
RUN_START_TIMEOUT_S = 240
INCIDENT_TIMEOUT_S = 900
CLEANUP_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: run scripts/setup-system.sh (Debian's `chromium` package)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the dev extra `playwright` is not installed"
    )
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def shots():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for old in ARTIFACTS.glob("*.png"):  # only this run's screenshots stay
        old.unlink()
    taken: list[Path] = []

    def shot(page, name: str, *, full_page: bool = False) -> Path:
        path = ARTIFACTS / f"{len(taken) + 1:02d}-{name}.png"
        page.screenshot(path=str(path), full_page=full_page)
        taken.append(path)
        return path

    return shot


def _fill_number(dialog, param: str, value: int) -> None:
    """Airflow's number inputs carry no name; their +/- buttons name the param and point at the input."""
    input_id = dialog.locator(f'[id="number-input:element_{param}:inc"]').get_attribute("aria-controls")
    field = dialog.locator(f'[id="{input_id}"]')
    field.fill(str(value))
    field.press("Tab")


def _stop_runs(api: AirflowApi, run: str) -> None:
    """Leave nothing running: wait for every DAG run of this training run (the first, the incident, the
    relaunch) to end, else fail it (the tasks' on_kill cancels the Slurm job)."""
    deadline = time.monotonic() + CLEANUP_TIMEOUT_S
    while True:
        live = [
            (r["dag_id"], r["dag_run_id"])
            for r in api.get("/dags/~/dagRuns", limit=100)["dag_runs"]
            if (r.get("conf") or {}).get("run_name") == run and r["state"] not in ("success", "failed")
        ]
        if not live:
            return
        if time.monotonic() > deadline:
            for dag_id, run_id in live:
                api.request("PATCH", f"/dags/{dag_id}/dagRuns/{run_id}", json={"state": "failed"})
            return
        time.sleep(5)


def _incident_runs(api: AirflowApi, run: str) -> list[str]:
    return [
        r["dag_run_id"]
        for r in api.get("/dags/sdc_incident/dagRuns")["dag_runs"]
        if (r.get("conf") or {}).get("run_name") == run
    ]


def _paste_into_editor(page, editor, text: str) -> None:
    """The form's JSON fields are code editors that re-render on every keystroke: paste the value."""
    page.evaluate("t => navigator.clipboard.writeText(t)", text)
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Control+V")


def _wait_for(what: str, timeout_s: float, probe, interval_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not seen after {timeout_s:.0f} s")
        time.sleep(interval_s)


def test_drill_from_the_form_shows_its_incident_on_run_health(airflow_stack, browser, shots):
    """A drill (a x10 gradient element on rank 1 at an audit step) triggered from the form: the run
    starts, the recompute check names rank 1's node, sdc_incident drains it, diagnoses and relaunches, and the
    run-health page shows the alert, the incident with its timeline and runbook, and the drained node."""
    url = airflow_stack.url
    api = AirflowApi.login(url, airflow_stack.user, airflow_stack.password, timeout=60)
    api.wait_dag_parsed(DAG_ID, timeout=180)
    api.wait_dag_parsed("sdc_incident", timeout=180)
    run = f"ui-{secrets.token_hex(3)}"
    drill = {"kind": "scale", "step": 10, "target": 1}

    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=url)
    page = context.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    try:
        # 1. Log in (SimpleAuthManager, the stack's generated admin password).
        page.goto(f"{url}/")
        page.get_by_label("Username").fill(airflow_stack.user)
        page.get_by_label("Password").fill(airflow_stack.password)
        shots(page, "login")
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url(f"{url}/")

        # 2. The trigger form of training_run, filled in field by field.
        page.goto(f"{url}/dags/{DAG_ID}")
        page.get_by_test_id("trigger-dag-button").click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_text(f"Trigger Dag - {DAG_ID}").wait_for()
        dialog.get_by_role("button", name="Run", exact=True).click()
        dialog.locator("#element_run_name").fill(run)
        _fill_number(dialog, "nodes", 3)
        dialog.get_by_role("button", name="Checks and checkpoints").click()
        _fill_number(dialog, "steps", 20)
        _fill_number(dialog, "checkpoint_every", 5)
        _fill_number(dialog, "recompute_every", 5)
        _fill_number(dialog, "vote_every", 5)
        dialog.get_by_role("button", name="Advanced Options").click()
        dialog.locator('input[name="dagRunId"]').fill(run)  # the run id we look for next
        dialog.get_by_role("button", name="Drill (fault injection)").click()
        _paste_into_editor(page, dialog.locator("#element_drill .monaco-editor"), json.dumps(drill))
        dialog.locator("#element_drill").get_by_text('"scale"').wait_for()
        shots(page, "trigger-form")
        dialog.get_by_test_id("trigger-dag-submit").click()

        # 3. The run starts with the params from the form.
        def started():
            try:
                r = api.run(DAG_ID, run)
            except AirflowApiError:
                return None  # not created yet
            return r if r["state"] in ("running", "success") else None

        conf = _wait_for(f"DAG run {run} running", RUN_START_TIMEOUT_S, started, 2)["conf"]
        assert (conf["run_name"], conf["nodes"], conf["steps"], conf["checkpoint_every"]) == (run, 3, 20, 5)
        assert conf["drill"] == drill
        page.goto(f"{url}/dags/{DAG_ID}/runs/{run}")
        page.get_by_text("Task Instances").first.wait_for()
        shots(page, "run-started")

        # 4. The plugin's "Run health" tab on the DAG run: an iframe with our page for this run.
        page.get_by_role("link", name="Run health").click()
        page.frame_locator("iframe").get_by_role("heading", name=f"Run health: {run}").wait_for()
        shots(page, "run-health-tab")

        # 5. The page itself, until the incident has been handled (the run relaunched without the node).
        health = f"{url}/longrun/runs/{run}"

        def relaunched() -> bool:
            page.goto(health)
            if page.locator(".incident .timeline").get_by_text("relaunched_running").count() > 0:
                return True
            # Fail fast, with the reason, when the job died before the drill could raise an alert.
            if api.run(DAG_ID, run)["state"] == "failed" and not _incident_runs(api, run):
                raise AssertionError(
                    f"{DAG_ID} {run} failed without an incident: {api.task_states(DAG_ID, run)}; "
                    f"page status {page.locator('#run-status').inner_text()!r}"
                )
            return False

        _wait_for(f"incident of {run} relaunched on {health}", INCIDENT_TIMEOUT_S, relaunched)
        assert page.locator("#alerts").get_by_role("cell", name="recompute", exact=True).count() == 1
        # Which node holds rank 1 depends on Slurm's placement: take it from the alert.
        suspect = page.locator("#alerts tr").nth(1).locator("td").nth(3).inner_text().strip()
        assert suspect in ("n1", "n2", "n3", "n4"), suspect
        incident = page.locator(".incident").first
        assert f"suspect nodes {suspect}" in incident.inner_text()

        # What is done with the node afterwards is the incident's policy; the view must show it as Slurm has it, and
        # mark it as this run's when its drain reason names the run.
        assert f"node={suspect}" in incident.inner_text()  # the drain fact
        rows = {n: page.locator("#nodes tr", has_text=n).inner_text() for n in ("n1", "n2", "n3", "n4")}
        for row in rows.values():
            assert ("this run" in row) == (f":{run}:" in row), row
        for alt in ("loss over steps", "replica fingerprint agreement"):
            img = page.get_by_alt_text(alt)
            page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=img.element_handle())
        shots(page, "run-health-incident", full_page=True)

        # 6. The runbook the incident links.
        incident.get_by_role("link", name="runbook: recompute-mismatch").click()
        page.get_by_role("heading").first.wait_for()
        assert "/longrun/runbooks/recompute-mismatch" in page.url
        shots(page, "runbook", full_page=True)

        # 6b. The suspect node's page, linked from the incident: the same history as `longrun nodes show`.
        page.goto(health)
        page.locator(".incident").first.get_by_role("link", name=suspect, exact=True).first.click()
        page.locator("#node-timeline").wait_for()
        assert f"/longrun/nodes/{suspect}" in page.url
        timeline = page.locator("#node-timeline tr.event").all()
        # Only this run's events: the node may have a history from earlier tests of the session.
        shown = [
            r.locator("td").nth(1).inner_text()
            for r in timeline
            if run in r.locator("td").nth(3).inner_text()
        ]
        assert shown[:2] == ["suspected", "drained"], shown
        cli = subprocess.run(
            [str(Path(sys.executable).parent / "longrun"), "nodes", "show", suspect, "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **airflow_stack.env},
        )
        assert cli.returncode == 0, cli.stderr
        events = [json.loads(line) for line in cli.stdout.splitlines()]
        kinds = [e["kind"] for e in events if e["run"] == run]
        assert kinds[: len(shown)] == shown, (kinds, shown)  # the diagnosis may have landed since
        shots(page, "node-page", full_page=True)

        # 7. The incident's own DAG run links to the same page, at the incident.
        (incident_run,) = _incident_runs(api, run)
        page.goto(f"{url}/dags/sdc_incident/runs/{incident_run}")
        page.get_by_role("link", name="Run health").click()
        page.frame_locator("iframe").get_by_role("heading", name=f"Run health: {run}").wait_for()
        assert any("#incident-" in f.url for f in page.frames), [f.url for f in page.frames]
        shots(page, "incident-run-health-tab")
    except BaseException:
        shots(page, "failure", full_page=True)
        raise
    finally:
        context.close()
        _stop_runs(api, run)
