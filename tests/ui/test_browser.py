"""The operator's path in a real browser: log into the Airflow UI, trigger `training_run` from its Params
form, see the run start, open its run-health page (the plugin's tab on the DAG run, and the page itself).

Headless Chromium from Debian's package, driven by Playwright through its executable path (no browser
download; `make test` installs the package via scripts/setup-system.sh). Everything else is real: the
session's Airflow (scheduler, triggerer, dag-processor, API server with the longrun plugin), Slurm and
SeaweedFS S3. Screenshots go to artifacts/browser/ (git-ignored), kept as the test's artifacts.
"""

from __future__ import annotations

import os
import secrets
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
PROGRESS_TIMEOUT_S = 300


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


def _stop_run(api: AirflowApi, run_id: str) -> None:
    """Leave nothing running: wait for the run to end, else fail it (its tasks' on_kill cancel the job)."""
    try:
        api.wait_run(DAG_ID, run_id, timeout=180)
    except AirflowApiError:
        api.request("PATCH", f"/dags/{DAG_ID}/dagRuns/{run_id}", json={"state": "failed"})


def test_trigger_from_the_form_and_open_run_health(airflow_stack, browser, shots):
    url = airflow_stack.url
    api = AirflowApi.login(url, airflow_stack.user, airflow_stack.password, timeout=60)
    api.wait_dag_parsed(DAG_ID, timeout=180)
    run = f"ui-{secrets.token_hex(3)}"

    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(UI_TIMEOUT_MS)

    # 1. Log in (SimpleAuthManager, the stack's generated admin password).
    page.goto(f"{url}/")
    page.get_by_label("Username").fill(airflow_stack.user)
    page.get_by_label("Password").fill(airflow_stack.password)
    shots(page, "login")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{url}/")

    # 2. The trigger form of training_run, filled in.
    page.goto(f"{url}/dags/{DAG_ID}")
    page.get_by_test_id("trigger-dag-button").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text("Unpause training_run on trigger").wait_for()
    dialog.get_by_role("button", name="Run", exact=True).click()
    dialog.locator("#element_run_name").fill(run)
    _fill_number(dialog, "nodes", 3)
    dialog.get_by_role("button", name="Checks and checkpoints").click()
    _fill_number(dialog, "steps", 20)
    _fill_number(dialog, "checkpoint_every", 10)
    _fill_number(dialog, "recompute_every", 5)
    _fill_number(dialog, "vote_every", 5)
    dialog.get_by_role("button", name="Advanced Options").click()
    dialog.locator('input[name="dagRunId"]').fill(run)  # the run id we look for next
    shots(page, "trigger-form", full_page=True)
    dialog.get_by_test_id("trigger-dag-submit").click()

    try:
        # 3. The run starts: the API sees it running, the run page says so.
        deadline = time.monotonic() + RUN_START_TIMEOUT_S
        state = None
        while time.monotonic() < deadline:
            try:
                dag_run = api.run(DAG_ID, run)
                state = dag_run["state"]
            except AirflowApiError:
                state = None  # not created yet
            if state in ("running", "success"):
                break
            time.sleep(2)
        assert state in ("running", "success"), f"DAG run {run} is {state!r} after {RUN_START_TIMEOUT_S} s"
        conf = dag_run["conf"]
        assert (conf["run_name"], conf["nodes"], conf["steps"], conf["checkpoint_every"]) == (run, 3, 20, 10)

        page.goto(f"{url}/dags/{DAG_ID}/runs/{run}")
        page.get_by_text(run, exact=True).first.wait_for()
        page.get_by_text("Task Instances").first.wait_for()
        shots(page, "run-started")

        # 4. The plugin's "Run health" tab on the DAG run: an iframe with our page for this run.
        page.get_by_role("link", name="Run health").click()
        frame = page.frame_locator("iframe")
        frame.get_by_role("heading", name=f"Run health: {run}").wait_for()
        shots(page, "run-health-tab")

        # 5. The page itself, once the trainer's heartbeat is in the store.
        health = f"{url}/longrun/runs/{run}"
        deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        step_text = "-"
        while time.monotonic() < deadline:
            page.goto(health)
            step_text = page.locator("#tile-step b").inner_text().strip()
            if step_text not in ("-", ""):
                break
            time.sleep(5)
        assert step_text not in ("-", ""), f"no heartbeat for {run} on {health} after {PROGRESS_TIMEOUT_S} s"
        assert page.locator("#run-status").inner_text() in ("training", "finished", "heartbeat stale")
        for alt in ("loss over steps", "replica fingerprint agreement"):
            img = page.get_by_alt_text(alt)
            img.wait_for()
            page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=img.element_handle())
        assert page.locator("#nodes").get_by_text("n1").count() == 1
        shots(page, "run-health-page", full_page=True)
    finally:
        page.close()
        _stop_run(api, run)
