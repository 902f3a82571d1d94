"""The model-checkpoint audit over a LocalDirStore: a healthy store passes; each broken property fails
with a message that names it and the offending key, and the report lands in the store either way."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from longrun.audit.config import AuditConfig, audit_id_from
from longrun.audit.expectations import PROPERTIES
from longrun.audit.rehash import sample_rows
from longrun.audit.run import AuditFailed, run_audit
from longrun.audit.table import build_table

from training.records import schema
from training.store.interface import get_json
from training.store.local import LocalDirStore

from .builders import (
    T0,
    healthy_run,
    put_checkpoint,
    put_promotion,
    put_suspect,
    put_validation,
    run_with_incident,
)


@pytest.fixture
def store(tmp_path: Path) -> LocalDirStore:
    s = LocalDirStore(tmp_path / "store")
    healthy_run(s, "alpha")
    run_with_incident(s, "beta")
    return s


def cfg(audit_id: str = "test", **kw: object) -> AuditConfig:
    return AuditConfig(audit_id=audit_id, sample_size=kw.pop("sample_size", 100), **kw)  # type: ignore[arg-type]


def test_healthy_store_passes_and_publishes(store: LocalDirStore) -> None:
    report = run_audit(store, cfg("good"))
    assert report.success and not report.findings
    assert report.counts == {
        "file": 6,
        "incident": 1,
        "manifest": 6,
        "promotion": 10,  # 3 + 5 history entries, 2 current pointers
        "suspect": 1,
        "validation": 7,
    }
    assert report.rehashed == 6
    summary = get_json(store, "audit/good/summary.json")
    assert summary["success"] is True and summary["rehashed"] == 6
    index = store.get_bytes(report.keys["docs"]).decode()
    assert "model_checkpoint_audit" in index
    assert any(i.key.startswith("audit/good/docs/validations/") for i in store.list("audit/good/docs/"))
    results = get_json(store, "audit/good/results.json")
    assert results["success"] is True
    assert report.docs_url.startswith("file://") and report.docs_url.endswith("audit/good/docs/index.html")


def test_audit_reads_real_saved_model_checkpoints(tmp_path: Path) -> None:
    import torch
    from longrun.checkpoints.promote import mark_suspect, promote
    from longrun.checkpoints.validate import validate

    from training.checkpoint import saver as checkpointing

    store = LocalDirStore(tmp_path / "store")
    model = torch.nn.Linear(8, 4)
    with checkpointing.CheckpointSaver(
        run="real",
        run_dir=tmp_path / "run",
        store=store,
        settings=checkpointing.SaverSettings(writer="thread", wait_timeout_s=60),
    ) as saver:
        for step in (5, 10):
            saver.save(
                step=step,
                model_state=model.state_dict(),
                manifest_fields={"loss": 1.25, "weight_vote": {"verdict": "pass"}},
            )
            assert saver.wait(60)
    assert not saver.failures, saver.failures
    for step in (5, 10):
        assert validate(store, "real", step)["ok"]
    promote(store, "real", 5)
    promote(store, "real", 10)
    report = run_audit(store, cfg("real"))
    assert report.counts["manifest"] == 2 and report.counts["file"] == 6
    assert report.rehashed == 6
    # Demote after 5: the validator's pointer moves back to 5, and the audit agrees it is clean.
    mark_suspect(store, "real", 5, "test incident", incident_id="t1")
    assert run_audit(store, cfg("real-demoted")).success


def _flip_a_byte(store: LocalDirStore) -> str:
    key = schema.store_key("alpha", schema.checkpoint_dir(20) + "model.pt")
    path = store.root / key
    data = bytearray(path.read_bytes())
    data[17] ^= 0x01
    path.write_bytes(bytes(data))  # behind the store's back, as bit rot would
    return key


def _bad_hash(s: LocalDirStore) -> str:
    return put_checkpoint(s, "alpha", 40, sha256="ABC123") and schema.store_key(
        "alpha", schema.checkpoint_dir(40) + "model.pt"
    )


def _promoted_but_invalid(s: LocalDirStore) -> str:
    # A later re-validation of the promoted step 30 failed: the promotion is no longer vouched for.
    put_validation(s, "alpha", 30, ok=False, time=T0 + 100, ident="v9")
    return schema.store_key("alpha", schema.PROMOTED_POINTER_PATH)


def _nan_loss(s: LocalDirStore) -> str:
    return put_checkpoint(s, "alpha", 40, loss=math.nan)


def _nan_flag(s: LocalDirStore) -> str:
    return put_checkpoint(s, "alpha", 40, nonfinite=["layer.weight"])


def _inf_loss(s: LocalDirStore) -> str:
    return put_checkpoint(s, "alpha", 40, loss=math.inf)


def _loss_out_of_band(s: LocalDirStore) -> str:
    return put_checkpoint(s, "alpha", 40, loss=5.0e6)


def _vote_failed(s: LocalDirStore) -> str:
    return put_checkpoint(s, "alpha", 40, weight_vote={"verdict": "fail", "suspect_ranks": [1]})


def _no_vote(s: LocalDirStore) -> str:
    return put_checkpoint(s, "alpha", 40, weight_vote={})


def _promoted_inside_suspect(s: LocalDirStore) -> str:
    # Demote everything after 10, but the pointer still names 30 (saved before the declaration).
    put_suspect(s, "alpha", after_step=10, time=T0 + 50)
    return schema.store_key("alpha", schema.PROMOTED_POINTER_PATH)


def _promoted_after_declaration(s: LocalDirStore) -> str:
    put_suspect(s, "alpha", after_step=10, until_step=25, time=T0 + 50)
    put_promotion(s, "alpha", 20, seq=9, time=T0 + 60, current=False)  # re-promoting a suspect one
    return schema.store_key("alpha", schema.promotion_history_path(9))


def _unparsable_manifest(s: LocalDirStore) -> str:
    key = schema.store_key("alpha", schema.manifest_path(40))
    s.put_bytes(key, b'{"kind": "manifest", "step": 4')  # truncated JSON
    return key


def _manifest_missing_field(s: LocalDirStore) -> str:
    key = schema.store_key("alpha", schema.manifest_path(40))
    s.put_bytes(
        key, json.dumps({"schema_version": 1, "kind": "manifest", "run": "alpha", "step": 40}).encode()
    )
    return key


def _step_not_increasing(s: LocalDirStore) -> str:
    # Step 5 saved after step 30 in the same run (a job that restarted from scratch over the old run).
    return put_checkpoint(s, "alpha", 5, time=T0 + 99)


def _step_not_matching_key(s: LocalDirStore) -> str:
    key = schema.store_key("alpha", schema.manifest_path(40))
    manifest = get_json(s, put_checkpoint(s, "alpha", 40))
    manifest["step"] = 41
    s.put_bytes(key, json.dumps(manifest).encode())
    return key


def _manifest_changed_after_validation(s: LocalDirStore) -> str:
    key = schema.store_key("alpha", schema.manifest_path(30))
    manifest = get_json(s, key)
    manifest["loss"] = 2.0  # still a valid manifest, but not the one that was validated
    s.put_bytes(key, json.dumps(manifest).encode())
    return schema.store_key("alpha", schema.PROMOTED_POINTER_PATH)


def _pointer_to_deleted_checkpoint(s: LocalDirStore) -> str:
    s.delete(schema.store_key("alpha", schema.manifest_path(30)))
    return schema.store_key("alpha", schema.PROMOTED_POINTER_PATH)


def _missing_object(s: LocalDirStore) -> str:
    key = schema.store_key("alpha", schema.checkpoint_dir(10) + "model.pt")
    s.delete(key)
    return key


BREAKAGES: dict[str, tuple[Callable[[LocalDirStore], str], str]] = {
    "bad hash": (_bad_hash, "sha256_wellformed"),
    "promoted but invalid": (_promoted_but_invalid, "promoted_validated"),
    "manifest changed after validation": (_manifest_changed_after_validation, "promoted_validated"),
    "pointer names a deleted model checkpoint": (_pointer_to_deleted_checkpoint, "promoted_validated"),
    "NaN loss": (_nan_loss, "loss_finite"),
    "NaN flag": (_nan_flag, "no_nan_flag"),
    "Inf loss": (_inf_loss, "loss_finite"),
    "loss out of band": (_loss_out_of_band, "loss_in_band"),
    "weight vote failed at save": (_vote_failed, "weight_vote_passed"),
    "no weight vote at save": (_no_vote, "weight_vote_passed"),
    "promoted inside suspect interval": (_promoted_inside_suspect, "promoted_not_suspect"),
    "promoted after declaration": (_promoted_after_declaration, "promoted_not_suspect"),
    "unparsable manifest": (_unparsable_manifest, "parsable"),
    "manifest missing fields": (_manifest_missing_field, "parsable"),
    "steps not increasing": (_step_not_increasing, "steps_increasing"),
    "step not matching key": (_step_not_matching_key, "step_matches_key"),
    "flipped byte": (_flip_a_byte, "rehash_matches"),
    "missing object": (_missing_object, "rehash_matches"),
}


@pytest.mark.parametrize("case", list(BREAKAGES))
def test_each_broken_property_fails_naming_it(store: LocalDirStore, case: str) -> None:
    breaker, prop = BREAKAGES[case]
    key = breaker(store)
    with pytest.raises(AuditFailed) as info:
        run_audit(store, cfg("broken"))
    message = str(info.value)
    assert f"{prop}: {PROPERTIES[prop]}" in message
    assert key in message
    assert "runbooks/audit-failed.md" in message
    assert info.value.report.docs_url in message
    summary = get_json(store, "audit/broken/summary.json")  # published before raising
    assert summary["success"] is False
    assert prop in {f["property"] for f in summary["findings"]}


def test_retention_of_old_promoted_checkpoints_passes(store: LocalDirStore) -> None:
    """Retention deletes once-promoted model checkpoints but keeps their history entries: not a finding."""
    from longrun.checkpoints.retention import apply_retention

    plan = apply_retention(store, "alpha", keep=1)
    assert plan["delete"] == [10, 20]
    report = run_audit(store, cfg("after-retention"))
    assert report.success and report.counts["manifest"] == 4


def test_nan_loss_also_raises_the_nan_flag(store: LocalDirStore) -> None:
    _nan_loss(store)
    with pytest.raises(AuditFailed) as info:
        run_audit(store, cfg("nan"))
    props = {f.prop for f in info.value.report.findings}
    assert props == {"loss_finite", "no_nan_flag"}


def test_unparsable_manifest_is_a_row_not_a_crash(store: LocalDirStore) -> None:
    key = _unparsable_manifest(store)
    table = build_table(store)
    row = table[table["key"] == key].iloc[0]
    assert row["kind"] == "manifest" and not row["parsable"] and row["step"] == 40
    assert "JSONDecodeError" in row["error"]


def test_rehash_sample_is_seeded_and_bounded(store: LocalDirStore) -> None:
    table = build_table(store)
    first = sample_rows(table, 3, seed=7)
    assert first == sample_rows(build_table(store), 3, seed=7)
    assert len(first) == 3 and set(table.loc[first, "kind"]) == {"file"}
    assert len(sample_rows(table, 1000, seed=7)) == 6
    assert sample_rows(table, 0, seed=7) == []


def test_flipped_byte_outside_the_sample_is_not_seen(store: LocalDirStore) -> None:
    _flip_a_byte(store)
    assert run_audit(store, cfg("nosample", sample_size=0)).rehashed == 0


def test_an_audit_of_named_runs_reads_only_those_runs(store: LocalDirStore) -> None:
    """`runs` scopes the audit: a broken run elsewhere in the store neither fails nor enters it."""
    healthy_run(store, "gamma")
    _nan_loss(store)  # breaks run "alpha" (the fixture's)
    report = run_audit(store, cfg("only-gamma", runs=("gamma",)))
    assert report.success
    assert set(build_table(store, ["gamma"])["run"]) == {"gamma"}
    assert get_json(store, "audit/only-gamma/summary.json")["runs"] == ["gamma"]
    with pytest.raises(AuditFailed, match="nan"):
        run_audit(store, cfg("only-alpha", runs=("alpha",)))
    with pytest.raises(AuditFailed):
        run_audit(store, cfg("all"))


def test_empty_store_passes(tmp_path: Path) -> None:
    report = run_audit(LocalDirStore(tmp_path / "empty"), cfg("empty"))
    assert report.success and report.rows == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"audit_id": "../x"}, "audit_id"),
        ({"audit_id": "a", "sample_size": -1}, "sample_size"),
        ({"audit_id": "a", "loss_min": 5.0, "loss_max": 1.0}, "loss_min"),
        ({"audit_id": "a", "loss_max": math.inf}, "loss_max"),
        ({"audit_id": "a", "prefix": "runs/audit/"}, "prefix"),
        ({"audit_id": "a", "runs": ("../other",)}, "runs"),
        ({"audit_id": "a", "runs": ["alpha"]}, "runs"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=f"AuditConfig.{field}"):
        AuditConfig(**kwargs)  # type: ignore[arg-type]


def test_audit_id_from_run_id() -> None:
    assert audit_id_from("scheduled__2026-11-29T00:00:00+00:00") == "scheduled__2026-11-29T00-00-00-00-00"
    assert audit_id_from("manual__2026-11-29T15:38:11.123+00:00").startswith(
        "manual__2026-11-29T15-38-11.123"
    )
    AuditConfig(audit_id=audit_id_from("///"))
