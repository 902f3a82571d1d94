"""Validation on both stores: a good checkpoint passes; each fault fails it and names the file."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
import torch
from ckpt_helpers import Saver, tiny_state
from longrun.checkpoints import catalog
from longrun.checkpoints.validate import check_payload, validate

from training.fingerprint.host import fingerprint_state
from training.records import schema
from training.store.interface import ObjectStore, put_json


def _key(run: str, step: int, name: str) -> str:
    return schema.store_key(run, schema.checkpoint_dir(step) + name)


def _snapshot(store: ObjectStore, run: str) -> dict[str, str]:
    return {
        i.key: hashlib.sha256(store.get_bytes(i.key)).hexdigest()
        for i in store.list(f"runs/{run}/checkpoints/")
    }


def test_a_good_checkpoint_passes_and_is_not_modified(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    save_checkpoints(store, run, [10])
    before = _snapshot(store, run)
    rec = validate(store, run, 10)
    assert rec["ok"], rec["errors"]
    assert rec["files"] == 3 and rec["bytes"] > 0 and rec["tensors"] > 0
    assert _snapshot(store, run) == before
    [(_key, stored)] = catalog.validations(store, run, 10)
    assert stored.extra["validation_id"] == rec["validation_id"] and stored.ok


@pytest.mark.parametrize("name", ["model.pt", "optim.pt", "extra.pt"])
def test_a_flipped_byte_fails_validation_and_names_the_file(
    store: ObjectStore, run: str, save_checkpoints: Saver, name: str
) -> None:
    save_checkpoints(store, run, [10])
    data = bytearray(store.get_bytes(_key(run, 10, name)))
    data[len(data) // 2] ^= 0x01
    store.put_bytes(_key(run, 10, name), bytes(data))  # bit rot in the stored object
    rec = validate(store, run, 10)
    assert not rec["ok"]
    assert len(rec["errors"]) == 1 and rec["errors"][0].startswith(f"{name}: sha256"), rec["errors"]


def test_a_truncated_file_fails_with_its_size(store: ObjectStore, run: str, save_checkpoints: Saver) -> None:
    save_checkpoints(store, run, [10])
    data = store.get_bytes(_key(run, 10, "model.pt"))
    store.put_bytes(_key(run, 10, "model.pt"), data[:-100])
    [err] = validate(store, run, 10)["errors"]
    assert err.startswith("model.pt: size") and str(len(data)) in err


def test_a_missing_file_is_named(store: ObjectStore, run: str, save_checkpoints: Saver) -> None:
    save_checkpoints(store, run, [10])
    store.delete(_key(run, 10, "optim.pt"))
    assert validate(store, run, 10)["errors"] == ["optim.pt: missing"]


def test_nan_weights_fail_and_name_the_tensor(store: ObjectStore, run: str, save_checkpoints: Saver) -> None:
    def poison(step: int, model: dict[str, torch.Tensor]) -> dict[str, object]:
        model["2.bias"][1] = float("nan")
        model["0.weight"][0, 0] = float("inf")
        return {"fingerprints": fingerprint_state(model)}  # the fingerprints agree: only finiteness fails

    save_checkpoints(store, run, [10], fields=poison)
    errors = validate(store, run, 10)["errors"]
    assert "model.pt: 0.weight: 1 of 128 values are NaN/Inf" in errors
    assert "model.pt: 2.bias: 1 of 4 values are NaN/Inf" in errors


def test_weights_that_differ_from_the_vote_majority_fail(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    other, _ = tiny_state(99)
    save_checkpoints(store, run, [10], fields=lambda step, model: {"fingerprints": fingerprint_state(other)})
    errors = validate(store, run, 10)["errors"]
    assert errors and all(e.startswith("model.pt: tensor ") for e in errors)
    assert any("'0.weight' fingerprint" in e and "majority" in e for e in errors)


class _NotATensor:
    pass


def test_a_payload_that_needs_pickle_fails_weights_only_load(tmp_path: Path) -> None:
    buf = io.BytesIO()
    torch.save({"w": torch.ones(2), "obj": _NotATensor()}, buf)
    (tmp_path / "model.pt").write_bytes(buf.getvalue())
    manifest = {
        "files": [
            {
                "name": "model.pt",
                "key": "x/model.pt",
                "size": len(buf.getvalue()),
                "sha256": hashlib.sha256(buf.getvalue()).hexdigest(),
            }
        ],
        "fingerprints": {"w": "0"},
    }
    errors, _warnings, _stats = check_payload(tmp_path, manifest)
    assert len(errors) == 1 and errors[0].startswith(
        "model.pt: does not load with torch.load(weights_only=True)"
    )


def test_an_unparsable_manifest_is_reported_and_ignored(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    from longrun.checkpoints.promote import PromotionRefused, promote

    save_checkpoints(store, run, [10, 20])
    store.put_bytes(_key(run, 20, "manifest.json"), b'{"kind": "manifest", "run": ')  # torn / garbage
    put_json(store, _key(run, 30, "manifest.json"), {"kind": "manifest", "schema_version": 99})
    cat = catalog.checkpoints(store, run)
    assert [c.step for c in cat.checkpoints] == [10]
    problems = {p.key.rsplit("/", 2)[-2]: p.error for p in cat.problems}
    assert set(problems) == {"step-00000020", "step-00000030"}
    assert "unreadable" in problems["step-00000020"] and "schema_version 99" in problems["step-00000030"]
    rec = validate(store, run, 20)
    assert (
        not rec["ok"]
        and rec["errors"][0].startswith("manifest.json: manifest")
        and "unreadable" in rec["errors"][0]
    )
    with pytest.raises(PromotionRefused, match="unreadable"):
        promote(store, run, 20)


def test_validation_records_parse_as_schema_records(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    save_checkpoints(store, run, [10])
    rec = validate(store, run, 10)
    [info] = list(store.list(schema.store_key(run, "validations/")))
    assert json.loads(store.get_bytes(info.key)) == json.loads(json.dumps(rec))
    schema.validate("validation", rec)


def test_a_manifest_whose_world_does_not_read_is_a_problem_not_a_checkpoint(
    store: ObjectStore, run: str, save_checkpoints: Saver
) -> None:
    """The table accepts any object as `world`; the catalog reads manifests as typed records, so one whose
    world does not read (size 0) is listed as a problem, and retention neither counts nor deletes it."""
    from longrun.checkpoints.retention import plan_retention

    save_checkpoints(store, run, [10, 20])
    key = _key(run, 20, "manifest.json")
    store.put_bytes(
        key, json.dumps({**json.loads(store.get_bytes(key)), "world": {"world_size": 0}}).encode()
    )
    cat = catalog.checkpoints(store, run)
    assert [c.step for c in cat.checkpoints] == [10]
    assert [(p.key, "does not read" in p.error and "world_size" in p.error) for p in cat.problems] == [
        (key, True)
    ]
    plan = plan_retention(store, run, keep=1)
    assert plan["unparsable"] == [key] and 20 not in plan["delete"]
