"""Unit tests of the training package's pure parts: fingerprints, data, faults, configs, votes, records."""

from __future__ import annotations

import json

import pytest
import torch

from training.checks.base import majority
from training.checks.recompute import derangement_offset
from training.config import CheckConfig, ModelConfig, TrainConfig, model_preset
from training.data import micro_batch
from training.dist import placement_from_env
from training.events import EventWriter
from training.faults import Fault, FaultSpecError, Injector, faults_from, parse_fault, perturb_linear_outputs
from training.fingerprint.host import (
    combine,
    fingerprint_state,
    fingerprint_tensor,
    from_int64,
    hex64,
    to_int64,
)
from training.model import build_model
from training.records import schema
from training.store.interface import get_json
from training.store.local import LocalDirStore

TINY = model_preset("tiny")


# ---- fingerprints ----------------------------------------------------------------------------------


def test_fingerprint_is_exact_over_bytes():
    t = torch.randn(1000)
    assert fingerprint_tensor(t) == fingerprint_tensor(t.clone())
    for i in (0, 123, 999):
        for bit in (0, 22, 31):
            u = t.clone()
            u.view(torch.int32)[i] ^= 1 << bit
            assert fingerprint_tensor(u) != fingerprint_tensor(t)
    swapped = t.clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    assert fingerprint_tensor(swapped) != fingerprint_tensor(t)  # a sum would not see a swap
    assert fingerprint_tensor(torch.tensor([0.0])) != fingerprint_tensor(torch.tensor([-0.0]))


def test_fingerprint_covers_dtype_shape_and_scalars():
    t = torch.arange(6, dtype=torch.float32)
    assert fingerprint_tensor(t) != fingerprint_tensor(t.view(2, 3))
    assert fingerprint_tensor(t) != fingerprint_tensor(t.to(torch.float64))
    assert fingerprint_tensor(torch.tensor(1.5)) != fingerprint_tensor(torch.tensor([1.5]))
    assert fingerprint_tensor(t[::2]) == fingerprint_tensor(t[::2].contiguous())


def test_fingerprint_int64_round_trip_and_state():
    for fp in (0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1):
        assert from_int64(to_int64(fp)) == fp and -(1 << 63) <= to_int64(fp) < 1 << 63
    model = build_model(TINY, seed=0)
    fps = fingerprint_state(model.state_dict())
    assert set(fps) == set(model.state_dict()) and all(len(v) == 16 for v in fps.values())
    assert combine(fps) == combine(dict(reversed(list(fps.items()))))
    assert hex64(-1) == "f" * 16


# ---- data and model determinism --------------------------------------------------------------------


def test_micro_batch_is_a_pure_function_of_seed_step_rank():
    a = micro_batch(TINY, seed=1, step=5, rank=2)
    assert a.shape == (TINY.batch_size, TINY.seq_len + 1) and a.dtype == torch.int64
    assert torch.equal(a, micro_batch(TINY, seed=1, step=5, rank=2))
    assert 0 <= int(a.min()) and int(a.max()) < TINY.vocab_size
    for other in (
        {"seed": 2, "step": 5, "rank": 2},
        {"seed": 1, "step": 6, "rank": 2},
        {"seed": 1, "step": 5, "rank": 3},
    ):
        assert not torch.equal(a, micro_batch(TINY, **other))


def test_same_seed_same_weights_and_gradients():
    m1, m2 = build_model(TINY, seed=3), build_model(TINY, seed=3)
    assert fingerprint_state(m1.state_dict()) == fingerprint_state(m2.state_dict())
    assert fingerprint_state(build_model(TINY, seed=4).state_dict()) != fingerprint_state(m1.state_dict())
    batch = micro_batch(TINY, seed=0, step=1, rank=0)
    g1 = torch.autograd.grad(m1.loss(batch), list(m1.parameters()))
    g2 = torch.autograd.grad(m2.loss(batch), list(m2.parameters()))
    assert all(fingerprint_tensor(a) == fingerprint_tensor(b) for a, b in zip(g1, g2, strict=True))
    perturb_linear_outputs(m2, lambda: True)  # the sick-node drill's hook changes the result
    g3 = torch.autograd.grad(m2.loss(batch), list(m2.parameters()))
    assert fingerprint_tensor(g1[-1]) != fingerprint_tensor(g3[-1])


# ---- fault specs -----------------------------------------------------------------------------------


def test_parse_fault_specs():
    assert parse_fault("nan:5:1") == Fault(kind="nan", step=5, rank=1)
    assert parse_fault(" sick-node:7:n2 ") == Fault(kind="sick-node", step=7, node="n2")
    assert parse_fault("sick-node:7:3") == Fault(kind="sick-node", step=7, rank=3)
    assert parse_fault("weight-flip:9:0").spec() == "weight-flip:9:0"
    assert parse_fault("nan:5:n2") == Fault(kind="nan", step=5, node="n2")
    env = {"LONGRUN_FAULTS": "crash:3:0, hang:4:1"}
    assert [f.kind for f in faults_from(["scale:2:1"], env)] == ["scale", "crash", "hang"]
    assert faults_from([], {}) == ()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nan:5", "not KIND:STEP:TARGET"),
        ("nan::1", "not KIND:STEP:TARGET"),
        ("bogus:5:1", "unknown"),
        ("nan:five:1", "STEP 'five' is not an integer"),
        ("nan:0:1", "step must be >= 1"),
        ("scale:5:-1", "neither a rank number nor a node name"),
        ("nan:5:n2;rm", "neither a rank number nor a node name"),
    ],
)
def test_bad_fault_specs_say_what_is_wrong(spec, message):
    with pytest.raises(FaultSpecError, match=message):
        parse_fault(spec)


def test_a_fault_aimed_at_a_node_hits_its_lowest_rank_only(tmp_path):
    """The rendezvous decides where each rank runs; a drill that names a node still hits one replica."""
    nodes = ["n3", "n1", "n2", "n1"]  # the node of each rank
    faults = (parse_fault("nan:5:n1"), parse_fault("weight-flip:6:n2"), parse_fault("scale:7:n9"))
    hit = {
        rank: [f.kind for f in Injector(faults, rank=rank, node=node, nodes=nodes, state_dir=tmp_path).mine]
        for rank, node in enumerate(nodes)
    }
    assert hit == {0: [], 1: ["nan"], 2: ["weight-flip"], 3: []}


def test_cli_rejects_a_bad_fault_before_starting(tmp_path, capsys):
    from training.train import main

    assert main(["--run-dir", str(tmp_path / "r"), "--steps", "3", "--fault", "nan:x:1"]) == 2
    assert "STEP 'x' is not an integer" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


# ---- configs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: CheckConfig(checks=("finite", "nope")), "checks="),
        (lambda: CheckConfig(recompute_every=-1), "recompute_every must be an integer >= 0, got -1"),
        (lambda: CheckConfig(on_verdict="ignore"), "on_verdict must be one of"),
        (lambda: CheckConfig(recompute_loss_rtol=2.0), "recompute_loss_rtol"),
        (
            lambda: ModelConfig(vocab_size=8, d_model=10, n_layers=1, n_heads=3, seq_len=4, batch_size=1),
            "n_heads=3",
        ),
        (lambda: model_preset("huge"), "model preset 'huge' is unknown"),
        (lambda: TrainConfig(run="a b", run_dir=".", steps=1, model=TINY), "run name 'a b'"),
        (
            lambda: TrainConfig(run="r", run_dir=".", steps=0, model=TINY),
            "steps must be a positive integer, got 0",
        ),
    ],
)
def test_bad_config_names_the_field(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# ---- votes and placement ---------------------------------------------------------------------------


def test_strict_majority():
    assert majority([1, 1, 2, 1]) == (1, [2])
    assert majority([1, 2, 1]) == (1, [1])
    assert majority([1, 1, 2, 2]) == (None, [])
    assert majority([1, 2]) == (None, [])
    assert majority([7]) == (7, [])


def test_derangement_puts_every_target_on_another_node():
    assert derangement_offset(["n1", "n2", "n3", "n4"]) == (1, True)
    assert derangement_offset(["n1", "n1", "n2", "n2"]) == (2, True)
    assert derangement_offset(["a", "a", "b", "b", "c", "c"]) == (2, True)
    assert derangement_offset(["n1", "n1"]) == (1, False)


def test_placement_from_launchers():
    p = placement_from_env(
        {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LONGRUN_NODE_NAMES": "a,b,c,d"}
    )
    assert (p.rank, p.world_size, p.node) == (2, 4, "c")
    p = placement_from_env(
        {"SLURM_PROCID": "1", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0", "SLURMD_NODENAME": "n7"}
    )
    assert (p.rank, p.world_size, p.local_rank, p.node) == (1, 3, 0, "n7")
    with pytest.raises(ValueError, match="names 2 nodes but this is rank 2"):
        placement_from_env({"RANK": "2", "WORLD_SIZE": "3", "LONGRUN_NODE_NAMES": "a,b"})
    with pytest.raises(ValueError, match="RANK"):
        placement_from_env({"RANK": "x", "WORLD_SIZE": "3"})


# ---- the event writer ------------------------------------------------------------------------------


def test_event_writer_alert_is_durable_in_run_dir_and_store(tmp_path):
    store = LocalDirStore(tmp_path / "store")
    ev = EventWriter(
        run="r1", run_dir=tmp_path / "run", store=store, rank=0, flush_every=3, progress_interval_s=60
    )
    alert = schema.record("alert", run="r1", step=4, check="finite", suspect_ranks=[1], suspect_nodes=["n2"],
                          evidence={"flags_by_rank": [0, 1]})  # fmt: skip
    path = ev.alert(alert)
    assert json.loads(path.read_text()) == alert
    [info] = list(store.list("runs/r1/alerts/"))
    assert get_json(store, info.key) == alert
    for step in (1, 2, 3, 4):
        ev.check(
            schema.record(
                "check", run="r1", step=step, check="finite", verdict="pass", rank=0, duration_s=0.001
            )
        )
        ev.progress(schema.record("progress", run="r1", step=step, loss=1.0, step_time_s=0.1))
    assert [i.key for i in store.list("runs/r1/checks/")] == ["runs/r1/checks/00000001-00000003-r000.jsonl"]
    assert get_json(store, "runs/r1/progress/latest.json")["step"] == 1  # throttled
    assert json.loads((tmp_path / "run" / "progress" / "latest.json").read_text())["step"] == 4  # every step
    ev.close()
    assert get_json(store, "runs/r1/progress/latest.json")["step"] == 4  # the last heartbeat at close
    assert [i.key.rsplit("/", 1)[1] for i in store.list("runs/r1/checks/")][
        -1
    ] == "00000004-00000004-r000.jsonl"
    assert len((tmp_path / "run" / "checks-live" / "r000.jsonl").read_text().splitlines()) == 4
