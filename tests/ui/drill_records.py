"""A run's records as the trainer, the checkpoint gate and the incident DAG write them: a 40-step,
3-rank drill with a recompute alert at step 25 on n2, a relaunch from step 20, and the run's end.

Built with the shared schema (and the incident module's own record functions), so a drift between the
writers and the view fails these tests.
"""

from __future__ import annotations

import json

from longrun.incident import record as incident_record

from training.records import schema
from training.store.interface import ObjectStore, put_json

T0 = 1_764_430_000.0
NODES = ["n1", "n2", "n3"]
ALERT_STEP = 25
RESTART_STEP = 20


def loss_at(step: int) -> float:
    return 4.0 * 0.97**step


def _put(store: ObjectStore, run: str, relative: str, obj: object) -> None:
    put_json(store, schema.store_key(run, relative), obj)


def _check(run: str, step: int, check: str, verdict: str = "pass", **extra: object) -> dict:
    return schema.record(
        "check",
        run=run,
        step=step,
        check=check,
        verdict=verdict,
        rank=0,
        duration_s=0.002,
        time=T0 + step,
        **extra,
    )


def fill_drill(store: ObjectStore, run: str = "drill-1", *, finished: bool = True) -> str:
    """Write the drill's records under runs/<run>/; returns the incident id."""
    # Check batches: the first job ran steps 1..25 (alert at 25), the relaunch 21..40.
    first = [_check(run, s, "finite", loss=loss_at(s)) for s in range(1, ALERT_STEP + 1)]
    first += [_check(run, s, "recompute") for s in (10, 20)]
    first += [_check(run, s, "weight_vote", evidence={"fingerprint": f"{s:016x}"}) for s in (10, 20)]
    first.append(
        _check(
            run,
            ALERT_STEP,
            "recompute",
            "fail",
            suspect_ranks=[1],
            suspect_nodes=["n2"],
            evidence={"votes": {"1": "n2 differs"}, "attributable": True},
        )
    )
    second = [_check(run, s, "finite", loss=loss_at(s) + 0.001) for s in range(RESTART_STEP + 1, 41)]
    second += [_check(run, s, "weight_vote", evidence={"fingerprint": f"{s:016x}"}) for s in (30, 40)]
    for relative, recs in (
        (schema.check_batch_path(1, ALERT_STEP, 0), first),
        (schema.check_batch_path(RESTART_STEP + 1, 40, 0), second),
    ):
        body = "".join(json.dumps(r) + "\n" for r in recs)
        store.put_bytes(schema.store_key(run, relative), body.encode())

    alert = schema.record(
        "alert",
        run=run,
        step=ALERT_STEP,
        check="recompute",
        suspect_ranks=[1],
        suspect_nodes=["n2"],
        evidence={"votes": {"1": "n2 differs"}},
        time=T0 + ALERT_STEP,
    )
    alert_rel = schema.alert_path(ALERT_STEP, "recompute", "r000-1764430025")
    _put(store, run, alert_rel, alert)

    world = {"size": 3, "nodes": NODES}
    for step in (10, 20, 30, 40):
        t = T0 + step + (100 if step > ALERT_STEP else 0)
        _put(
            store,
            run,
            schema.manifest_path(step),
            schema.record(
                "manifest",
                run=run,
                step=step,
                time=t,
                files=[],
                fingerprints={},
                weight_vote={"ok": True},
                coverage={},
                loss=loss_at(step),
                code_version="test",
                world=world,
            ),
        )
        _put(
            store,
            run,
            schema.validation_path(step, "v1"),
            schema.record("validation", run=run, step=step, ok=True, errors=[], time=t + 1),
        )
    # 10 and 20 promoted before the alert; 30 was promoted after the relaunch; 40 validated only.
    for seq, step in enumerate((10, 20, 30)):
        _put(
            store,
            run,
            schema.promotion_history_path(seq),
            schema.record(
                "promotion",
                run=run,
                step=step,
                manifest_key=schema.manifest_path(step),
                time=T0 + step + 2,
                seq=seq,
            ),
        )
    # The pointer is the newest promotion record, as `longrun.checkpoints.promote` writes it.
    _put(
        store,
        run,
        schema.PROMOTED_POINTER_PATH,
        schema.record(
            "promotion", run=run, step=30, manifest_key=schema.manifest_path(30), time=T0 + 32, seq=2
        ),
    )
    # A checkpoint saved between the last good step and the alert would be suspect; this drill has a
    # separate one at 24 (saved by an extra save) to show it.
    _put(
        store,
        run,
        schema.manifest_path(24),
        schema.record(
            "manifest",
            run=run,
            step=24,
            time=T0 + 24,
            files=[],
            fingerprints={},
            weight_vote={"ok": True},
            coverage={},
            loss=loss_at(24),
            code_version="test",
            world=world,
        ),
    )
    _put(
        store,
        run,
        schema.suspect_path("after-20"),
        schema.record(
            "suspect",
            run=run,
            after_step=RESTART_STEP,
            reason="recompute alert at 25",
            time=T0 + 30,
        ),
    )

    alert_key = schema.store_key(run, alert_rel)
    rec = incident_record.open_incident(store, run=run, alert=alert, alert_key=alert_key, mode="act")
    ident = rec["incident_id"]
    for name, fields in (
        ("frozen", {}),
        ("attributed", {"attribution": {"verdict": "node", "node": "n2", "reason": "2 of 3 recomputes"}}),
        ("drained", {"drain": {"node": "n2", "reason": f"longrun:sdc:{run}:{ALERT_STEP}"}}),
        ("diagnosed", {"diagnosis": {"verdict": "fail", "summary": "replay probe fingerprint differs"}}),
        (
            "relaunched",
            {
                "checkpoint": {"step": RESTART_STEP, "why": "newest promoted before the alert"},
                "lost_steps": ALERT_STEP - RESTART_STEP,
                "status": incident_record.RELAUNCHED,
                "relaunch": {"job_id": 7, "nodes": ["n1", "n3", "n4"], "exclude": ["n2"]},
                "time_to_recover_s": 6.5,
            },
        ),
    ):
        incident_record.add_event(store, run=run, incident_id=ident, name=name, fields=fields)

    last, at = (40, T0 + 200) if finished else (33, T0 + 150)
    _put(
        store,
        run,
        schema.PROGRESS_PATH,
        schema.record(
            "progress", run=run, step=last, loss=loss_at(last), step_time_s=0.05, time=at, total_steps=40
        ),
    )
    if finished:
        _put(
            store,
            run,
            schema.REPORT_PATH,
            schema.record(
                "report", run=run, final_step=40, final_fingerprint="00ff00ff00ff00ff", time=T0 + 201
            ),
        )
    return ident
