"""Sharded (dcp-v1) checkpoints through the store: upload on rank 0, the orchestrator's validation (which
recomputes every rank's shard fingerprints from the full tensors), promotion, the audit's listing and
re-hash, and fetch_sharded + load_sharded for a resume.

One spawn of six gloo ranks per module (FSDP2 over a 3 x 2 HSDP mesh, uneven and empty shards and a
replicated buffer included) makes two saves: step 2, which rank 0 uploads, fetches back, and every rank
resumes from; and step 3, saved with a NaN in one shard. The tests then work on copies of that store and
those folders in this process, as the orchestrator and an auditor would: no process group."""

from __future__ import annotations

import io
import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.gloo_ranks import join_group, spawn_ranks, write_result
from longrun.checkpoints.promote import PromotionRefused, promote
from longrun.checkpoints.validate import validate
from torch import nn

from training.checkpoint.load import load_checkpoint
from training.checkpoint.manifest import CheckpointError
from training.checkpoint.sharded import MANIFEST, validate_sharded
from training.checkpoint.sharded_store import fetch_sharded, upload_sharded
from training.checkpoint.sharded_verify import local_shard, read_dcp_metadata, shard_coordinates
from training.records import schema
from training.store.interface import dump_json, sha256_file
from training.store.local import LocalDirStore

RUN = "sharded-run"
WORLD = 6
FIELDS: dict[str, Any] = {
    "fingerprints": {},  # no rank holds the whole model
    "weight_vote": {"verdict": "pass", "step": 2},
    "coverage": {},
    "loss": 0.5,
    "code_version": "test",
    "world": {"nodes": ["n0"], "ranks": ["n0"] * WORLD, "world_size": WORLD},
}
SHARD_FILES = {".metadata", "extra.pt"} | {f"__{r}_0.distcp" for r in range(WORLD)}


def _model(mesh: Any, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Linear(8, 5) and Linear(5, 1) sharded over 2: 3 + 2 rows, and 1 + 0 (an empty shard); a buffer that
    FSDP2 leaves whole on every rank."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 5), nn.ReLU(), nn.Linear(5, 1))
    model[0].register_buffer("mask", torch.arange(4.0) + seed)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.05)


def _train(model: nn.Module, opt: torch.optim.Optimizer, rank: int, steps: range) -> None:
    for step in steps:
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * step + rank))
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()


def _local_optim(opt: torch.optim.Optimizer) -> dict[str, str]:
    from training.fingerprint.host import fingerprint_state, local_part

    out = {}
    for i, state in enumerate(opt.state.values()):
        for k, v in state.items():
            out[f"{i}.{k}"] = local_part(v)
    return fingerprint_state(out)


def _worker(rank: int, world: int, port: int, out: str, store_root: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from training.checkpoint.sharded import load_sharded, save_sharded
    from training.fingerprint.host import fingerprint_state, local_state

    join_group(rank, world, port)
    found: dict[str, Any] = {}
    try:
        mesh = init_device_mesh("cpu", (3, 2), mesh_dim_names=("replicate", "shard"))
        model, opt = _model(mesh, seed=0)
        _train(model, opt, rank, range(2))
        folder = Path(out, "step-2")
        save_sharded(folder, model, opt, step=2, mesh=mesh, extra_state={"rng": torch.get_rng_state()})
        at_save = fingerprint_state(local_state(model.state_dict()))
        optim_at_save = _local_optim(opt)
        if rank == 0:  # the job side: rank 0 uploads once every rank's save returned, then fetches it back
            store = LocalDirStore(store_root)
            found["upload"] = upload_sharded(store, run=RUN, step=2, folder=folder, manifest_fields=FIELDS)
            prefix = schema.store_key(RUN, schema.checkpoint_dir(2))
            fetch_sharded(store, prefix, Path(out, "fetched"))
        dist.barrier()
        fresh, fresh_opt = _model(mesh, seed=1)
        found["fresh_differs"] = fingerprint_state(local_state(fresh.state_dict())) != at_save
        load_sharded(Path(out, "fetched"), fresh, fresh_opt, mesh=mesh)
        found["resumed_equals_saved"] = fingerprint_state(local_state(fresh.state_dict())) == at_save
        found["optim_resumed_equals_saved"] = _local_optim(fresh_opt) == optim_at_save
        # Step 3: one shard of '2.weight' (the ranks at shard index 0 hold its only row) is NaN, on every
        # replica alike, as a diverged model would save it.
        if mesh["shard"].get_local_rank() == 0:
            with torch.no_grad():
                model[2].weight.to_local()[0, 1] = float("nan")
        save_sharded(Path(out, "step-3"), model, opt, step=3, mesh=mesh)
        write_result(out, rank, found)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One spawn of six ranks: the store after rank 0's upload of step 2, the saved folders, each rank's
    findings."""
    out = tmp_path_factory.mktemp("sharded-store")
    store_root = out / "store"
    per_rank = spawn_ranks(_worker, WORLD, out, str(store_root))
    return {"out": out, "store": store_root, "ranks": per_rank}


@pytest.fixture
def store(saved: dict[str, Any], tmp_path: Path) -> LocalDirStore:
    """This test's own copy of the store as rank 0's upload left it."""
    shutil.copytree(saved["store"], tmp_path / "store")
    return LocalDirStore(tmp_path / "store")


def _key(name: str, step: int = 2) -> str:
    return schema.store_key(RUN, schema.checkpoint_dir(step) + name)


def _record(store: LocalDirStore, step: int = 2) -> dict[str, Any]:
    return json.loads(store.get_bytes(_key("manifest.json", step)))


def test_rank0_uploads_the_shards_then_the_record_and_a_6_rank_resume_from_the_store_is_bit_identical(
    saved: dict[str, Any], store: LocalDirStore
) -> None:
    for r, found in enumerate(saved["ranks"]):
        assert found["fresh_differs"] is True, r  # the resume had something to prove
        assert found["resumed_equals_saved"] is True, r
        assert found["optim_resumed_equals_saved"] is True, r
    up = saved["ranks"][0]["upload"]
    assert up["ok"] is True and up["uploaded"] is True and up["error"] is None, up
    assert json.loads(store.get_bytes(schema.store_key(RUN, schema.save_path(2))))["ok"] is True
    objects = {i.key.rsplit("/", 1)[1] for i in store.list(_key(""))}
    assert objects == SHARD_FILES | {MANIFEST, "manifest.json"}
    record = _record(store)
    sharded = json.loads((saved["out"] / "step-2" / MANIFEST).read_text())
    assert record["format"] == "dcp-v1"
    for field in ("world_size", "mesh", "shard_fingerprints"):
        assert record[field] == sharded[field], field
    assert record["mesh"] == {"dims": ["replicate", "shard"], "shape": [3, 2]}
    assert {f["name"] for f in record["files"]} == SHARD_FILES | {MANIFEST}
    for f in record["files"]:
        assert f["key"] == schema.checkpoint_dir(2) + f["name"]
        assert f["sha256"] == sha256_file(saved["out"] / "step-2" / f["name"]), f
    # The unsharded loader refuses it rather than torch.load a DCP shard.
    with pytest.raises(CheckpointError, match="sharded"):
        load_checkpoint(_key(""), store)


def test_uploaded_checkpoint_validates_is_promoted_and_the_audit_lists_and_rehashes_every_shard(
    store: LocalDirStore,
) -> None:
    from longrun.audit.rehash import rehash_sample
    from longrun.audit.table import build_table

    rec = validate(store, RUN, 2)
    assert rec["ok"], rec["errors"]
    assert rec["files"] == len(SHARD_FILES) + 1 and rec["tensors"] > 0 and rec["warnings"] == []
    assert promote(store, RUN, 2)["step"] == 2
    table = build_table(store, [RUN])
    files = table[table["kind"] == "file"]
    assert {k.rsplit("/", 1)[1] for k in files["key"]} == SHARD_FILES | {MANIFEST}
    assert rehash_sample(store, table, sample_size=100, seed=0) == len(SHARD_FILES) + 1
    assert table[table["kind"] == "file"]["rehash_ok"].all()


def test_a_flipped_byte_in_a_stored_shard_fails_validation_naming_it_and_is_never_promoted(
    store: LocalDirStore,
) -> None:
    from longrun.audit.rehash import rehash_sample
    from longrun.audit.table import build_table

    blob = bytearray(store.get_bytes(_key("__3_0.distcp")))
    blob[len(blob) // 2] ^= 0x10
    store.put_bytes(_key("__3_0.distcp"), bytes(blob))  # bit rot in the stored object
    rec = validate(store, RUN, 2)
    assert not rec["ok"]
    assert rec["errors"] == [
        "__3_0.distcp: SHA-256 differs from the manifest's (the file changed after the save)"
    ]
    with pytest.raises(PromotionRefused, match="__3_0.distcp"):
        promote(store, RUN, 2)
    table = build_table(store, [RUN])
    rehash_sample(store, table, sample_size=100, seed=0)
    bad = table[(table["kind"] == "file") & (table["rehash_ok"] == False)]  # noqa: E712 (a pandas mask)
    assert list(bad["key"]) == [_key("__3_0.distcp")]


def test_a_shard_deleted_from_the_store_fails_validation_and_is_never_promoted(store: LocalDirStore) -> None:
    store.delete(_key("__5_0.distcp"))
    rec = validate(store, RUN, 2)
    assert not rec["ok"]
    assert rec["errors"] == ["__5_0.distcp: listed in the manifest, missing from the checkpoint folder"]
    with pytest.raises(PromotionRefused, match="failed its latest validation"):
        promote(store, RUN, 2)


def test_a_record_whose_shard_fingerprint_was_altered_fails_naming_the_rank_and_tensor(
    store: LocalDirStore,
) -> None:
    record = _record(store)
    record["shard_fingerprints"]["4"]["0.weight"] = "0123456789abcdef"
    store.put_bytes(_key("manifest.json"), dump_json(record))
    rec = validate(store, RUN, 2)
    assert not rec["ok"]
    assert any(e.startswith("rank 4: tensor '0.weight': shard recomputed") for e in rec["errors"]), rec[
        "errors"
    ]
    assert any(e.startswith("manifest.json: rank 4: tensor '0.weight'") for e in rec["errors"]), rec["errors"]
    assert all("rank 4" in e for e in rec["errors"]), rec["errors"]


def test_a_record_that_disagrees_with_the_sharded_manifest_fails_naming_each_difference(
    store: LocalDirStore,
) -> None:
    record = _record(store)
    for f in record["files"]:
        if f["name"] == ".metadata":
            f["size"] += 1
        if f["name"] == MANIFEST:
            f["sha256"] = "0" * 64
    record["files"].append({"name": "__9_0.distcp", "key": "x", "size": 1, "sha256": "0" * 64})
    record["mesh"] = {"dims": ["replicate", "shard"], "shape": [2, 3]}
    store.put_bytes(_key("manifest.json"), dump_json(record))
    rec = validate(store, RUN, 2)
    assert rec["errors"] == [
        f"manifest.json: lists __9_0.distcp, which {MANIFEST} does not",
        f"manifest.json: .metadata: size or SHA-256 differs from {MANIFEST}'s",
        f"manifest.json: {MANIFEST}: size or SHA-256 differs from the file's",
        "manifest.json: mesh {'dims': ['replicate', 'shard'], 'shape': [2, 3]} != sharded-manifest.json's"
        " {'dims': ['replicate', 'shard'], 'shape': [3, 2]}",
    ]


def _rewrite_one_value(folder: Path, fqn: str, offset: tuple[int, ...]) -> str:
    """Change one value of one chunk of `fqn` inside its rank file (DCP still loads it), then re-hash that
    file in the sharded-manifest: the folder is whole and consistent, only the values are not the saved
    ones. `offset`: the chunk's (DCP's chunk index is not stable). Returns the rank file's name."""
    meta = read_dcp_metadata(folder)
    index, info = next(
        (i, s) for i, s in meta.storage_data.items() if i.fqn == fqn and tuple(i.offset) == offset
    )
    path = folder / info.relative_path
    blob = bytearray(path.read_bytes())
    piece = bytes(blob[info.offset : info.offset + info.length])
    raw = torch.load(io.BytesIO(piece), weights_only=True).contiguous().numpy().tobytes()
    blob[info.offset + piece.find(raw)] ^= 0x01  # the lowest mantissa bit of the chunk's first value
    path.write_bytes(bytes(blob))
    sharded = json.loads((folder / MANIFEST).read_text())
    for f in sharded["files"]:
        if f["name"] == info.relative_path:
            f["sha256"] = sha256_file(path)
    (folder / MANIFEST).write_text(json.dumps(sharded, indent=1, sort_keys=True))
    assert validate_sharded(folder) == []
    return info.relative_path


def test_shards_rewritten_and_rehashed_pass_every_hash_and_are_caught_by_the_recompute(
    saved: dict[str, Any], tmp_path: Path
) -> None:
    folder = tmp_path / "step-2"
    shutil.copytree(saved["out"] / "step-2", folder)
    _rewrite_one_value(folder, "model.0.weight", (3, 0))  # rows 3-4: what shard index 1 holds
    store = LocalDirStore(tmp_path / "store")
    up = upload_sharded(store, run=RUN, step=2, folder=folder, manifest_fields=FIELDS)
    assert up["ok"], up  # the folder is whole: nothing before the recompute can tell
    rec = validate(store, RUN, 2)
    assert not rec["ok"]
    # Shard index 1 is ranks 1, 3 and 5 on the 3 x 2 mesh (row-major; 'replicate' outer).
    assert [e.split(":")[0] for e in rec["errors"]] == ["rank 1", "rank 3", "rank 5"], rec["errors"]
    assert all("tensor '0.weight': shard recomputed from the checkpoint" in e for e in rec["errors"])


def test_a_nan_saved_in_a_shard_is_named_by_tensor_and_rank_file(
    saved: dict[str, Any], tmp_path: Path
) -> None:
    store = LocalDirStore(tmp_path / "store")
    fields = {**FIELDS, "weight_vote": {"verdict": "pass", "step": 3}}
    up = upload_sharded(store, run=RUN, step=3, folder=saved["out"] / "step-3", manifest_fields=fields)
    assert up["ok"], up
    rec = validate(store, RUN, 3)
    assert not rec["ok"]
    [error] = rec["errors"]  # the shard fingerprints agree: the NaN was saved as the ranks held it
    assert error.endswith(": model.2.weight: 1 of 5 values are NaN/Inf") and error.startswith("__"), error
    meta = read_dcp_metadata(saved["out"] / "step-3")
    holder = next(
        s.relative_path
        for i, s in meta.storage_data.items()
        if i.fqn == "model.2.weight" and tuple(i.offset) == (0, 0)
    )
    assert error.startswith(f"{holder}: "), (error, holder)
    with pytest.raises(PromotionRefused):
        promote(store, RUN, 3)


def test_upload_never_overwrites_a_published_checkpoint(saved: dict[str, Any], store: LocalDirStore) -> None:
    before = store.head(_key("manifest.json"))
    up = upload_sharded(store, run=RUN, step=2, folder=saved["out"] / "step-2", manifest_fields=FIELDS)
    assert up["ok"] is False and up["uploaded"] is False
    assert "already exists" in up["error"], up
    assert store.head(_key("manifest.json")) == before


def test_upload_of_a_step_other_than_the_folders_is_refused(saved: dict[str, Any], tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "store")
    up = upload_sharded(store, run=RUN, step=3, folder=saved["out"] / "step-2", manifest_fields=FIELDS)
    assert up["ok"] is False and "is of step 2, not 3" in up["error"], up
    assert list(store.list("runs/")) == []


def test_upload_of_a_folder_missing_a_rank_file_records_the_error_and_writes_no_manifest(
    saved: dict[str, Any], tmp_path: Path
) -> None:
    folder = tmp_path / "step-2"
    shutil.copytree(saved["out"] / "step-2", folder)
    (folder / "__4_0.distcp").unlink()
    store = LocalDirStore(tmp_path / "store")
    up = upload_sharded(store, run=RUN, step=2, folder=folder, manifest_fields=FIELDS)
    assert up["ok"] is False and up["uploaded"] is False
    assert "__4_0.distcp: listed in the manifest, missing" in up["error"], up
    assert store.head(_key("manifest.json")) is None
    assert list(store.list("runs/")) == []  # nothing of a refused folder is uploaded


def test_fetch_refuses_what_it_cannot_resume_from(
    saved: dict[str, Any], store: LocalDirStore, tmp_path: Path
) -> None:
    prefix = _key("")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(CheckpointError, match="not an empty folder"):
        fetch_sharded(store, prefix, busy)
    with pytest.raises(CheckpointError, match="not found"):
        fetch_sharded(store, _key("", step=9), tmp_path / "none")
    # An unsharded record at the prefix: refused, naming the format.
    record = _record(store)
    del record["format"]
    record["files"] = [f for f in record["files"] if not f["name"].startswith(".")]
    store.put_bytes(_key("manifest.json"), dump_json(record))
    with pytest.raises(CheckpointError, match="not a sharded"):
        fetch_sharded(store, prefix, tmp_path / "unsharded")
    # A shard missing from the store, and one damaged in it: named.
    fresh = LocalDirStore(tmp_path / "fresh")
    assert upload_sharded(fresh, run=RUN, step=2, folder=saved["out"] / "step-2", manifest_fields=FIELDS)[
        "ok"
    ]
    fresh.delete(_key("__2_0.distcp"))
    with pytest.raises(CheckpointError, match="__2_0.distcp: listed in .*missing from the store"):
        fetch_sharded(fresh, prefix, tmp_path / "missing")
    fresh.put_file(_key("__2_0.distcp"), saved["out"] / "step-2" / "__1_0.distcp")
    with pytest.raises(CheckpointError, match="__2_0.distcp: "):
        fetch_sharded(fresh, prefix, tmp_path / "damaged")


def test_metadata_is_read_through_an_allowlist(saved: dict[str, Any], tmp_path: Path) -> None:
    folder = tmp_path / "evil"
    shutil.copytree(saved["out"] / "step-2", folder)
    (folder / ".metadata").write_bytes(pickle.dumps(shutil.rmtree))  # a global that is no DCP metadata
    with pytest.raises(CheckpointError, match="shutil.rmtree, not a DCP metadata class"):
        read_dcp_metadata(folder)


class _Reduce:
    """Pickles as `fn(*args)`: what a hostile `.metadata` would hold."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, ...]:
        return self.fn, self.args


def test_metadata_getattr_reaches_only_the_dcp_enum_members(saved: dict[str, Any], tmp_path: Path) -> None:
    """Python 3.11 pickles an enum member as getattr(enum class, name), so the allowlist passes getattr, but
    only for DCP's memory-format enum and its members: a getattr that climbs to a callable is refused."""
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    folder = tmp_path / "evil"
    shutil.copytree(saved["out"] / "step-2", folder)
    member = pickle.dumps(_Reduce(getattr, _MEM_FORMAT_ENCODING, "TORCH_CONTIGUOUS_FORMAT"))
    (folder / ".metadata").write_bytes(member)
    with pytest.raises(CheckpointError, match="holds a _MEM_FORMAT_ENCODING, not DCP metadata"):
        read_dcp_metadata(folder)  # read, then refused for what it is, not for the getattr
    for attack in (
        _Reduce(getattr, _MEM_FORMAT_ENCODING, "__class__"),
        _Reduce(getattr, torch.Size, "__new__"),
    ):
        (folder / ".metadata").write_bytes(pickle.dumps(attack))
        with pytest.raises(CheckpointError, match="is not a DCP enum member"):
            read_dcp_metadata(folder)


def test_local_shards_follow_torch_chunk_on_the_shard_dimension() -> None:
    t = torch.arange(10.0).reshape(5, 2)
    assert [local_shard(t, i, 2, replicated=False).shape[0] for i in range(2)] == [3, 2]
    one = torch.ones(1, 3)
    assert local_shard(one, 1, 2, replicated=False).shape == (0, 3)  # past the last chunk: empty
    assert local_shard(one, 1, 2, replicated=True) is one
    mesh = {"dims": ["replicate", "shard"], "shape": [3, 2]}
    assert shard_coordinates(mesh, 6) == [(0, 2), (1, 2)] * 3
    assert (
        shard_coordinates({"dims": ["shard", "replicate"], "shape": [2, 3]}, 6) == [(0, 2)] * 3 + [(1, 2)] * 3
    )
    with pytest.raises(CheckpointError, match="does not hold a world of 4"):
        shard_coordinates(mesh, 4)


@pytest.mark.s3
def test_the_same_round_trip_through_s3(
    saved: dict[str, Any], s3_env: dict[str, str], tmp_path: Path
) -> None:
    """SeaweedFS: DCP's `.metadata` is a key like any other; upload, validate, fetch, and a flipped byte."""
    import uuid

    from training.store.s3 import S3Store

    s3 = S3Store(bucket=s3_env["LONGRUN_BUCKET"], endpoint_url=s3_env["AWS_ENDPOINT_URL"])
    run = f"sharded-{uuid.uuid4().hex[:8]}"
    up = upload_sharded(s3, run=run, step=2, folder=saved["out"] / "step-2", manifest_fields=FIELDS)
    assert up["ok"], up
    assert validate(s3, run, 2)["ok"]
    prefix = schema.store_key(run, schema.checkpoint_dir(2))
    fetched = fetch_sharded(s3, prefix, tmp_path / "fetched")
    assert validate_sharded(fetched) == []
    key = prefix + "__3_0.distcp"
    blob = bytearray(s3.get_bytes(key))
    blob[len(blob) // 2] ^= 0x10
    s3.put_bytes(key, bytes(blob))
    rec = validate(s3, run, 2)
    assert not rec["ok"] and rec["errors"][0].startswith("__3_0.distcp: SHA-256 differs"), rec["errors"]
