"""The Hugging Face example (training/examples/hf_gpt2.py) under the guard: a GPT-2 from `transformers`, a
BPE tokenizer trained at start, a checkpointed data loader, AdamW with warm-up and cosine, dropout on.
Real processes: 3 gloo ranks on CPU, nodes n1..n3, every longrun setting from the environment.

A clean run raises no alert; its resume from the mid-run checkpoint ends on the same weights bit for bit
(the data loader, the scheduler and the RNG resume); each drill is caught by the intended check, naming the
right rank and node."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers", reason="the Hugging Face example needs the optional 'hf' extra")
pytest.importorskip("tokenizers", reason="the Hugging Face example needs the optional 'hf' extra")

from training.records.schema import EXIT_SDC_VERDICT  # noqa: E402

MODULE = "training.examples.hf_gpt2"
NODES = "n1,n2,n3"
STEPS = 12
ENV = {
    "LONGRUN_STEPS": str(STEPS),
    "LONGRUN_CHECKPOINT_EVERY": "4",
    "LONGRUN_RECOMPUTE_EVERY": "4",
    "LONGRUN_VOTE_EVERY": "4",
    "LONGRUN_SEED": "5",
}
#: The smallest size that still shows what the tests claim: 10 standard-library files (about 345 blocks of
#: 128 tokens, over 100 per rank), a 512-token vocabulary, 2 sequences per rank and step. 60 files and 8
#: sequences cost about 10 s more CPU per launch (a third more), and these tests launch 5 times.
ARGS = ["--files", "10", "--vocab-size", "512", "--batch-size", "2"]


def run_example(launch, *, name: str = "run", env: dict[str, str] | None = None):
    return launch(ARGS, name=name, nodes=NODES, env={**ENV, **(env or {})}, module=MODULE, timeout_s=400.0)


def test_clean_run_and_its_resume_end_on_the_same_weights(launch):
    full = run_example(launch, name="full")
    assert full.rcs == [0] * 3, full.log()
    assert full.alerts() == []
    records = full.checks()
    assert {r["verdict"] for r in records} == {"pass"}
    assert {c: sum(r["check"] == c for r in records) for c in ("finite", "recompute", "weight_vote")} == {
        "finite": STEPS, "recompute": STEPS // 4, "weight_vote": STEPS // 4,
    }  # fmt: skip
    report = full.report()
    assert report["final_step"] == STEPS and report["final_fingerprint"]

    ckpt = full.run_dir / "checkpoints" / "step-00000008"
    assert (ckpt / "manifest.json").exists(), sorted(p.name for p in (full.run_dir / "checkpoints").iterdir())
    resumed = run_example(launch, name="resumed", env={"LONGRUN_RESUME_FROM": str(ckpt)})
    assert resumed.rcs == [0] * 3, resumed.log()
    assert min(r["step"] for r in resumed.checks()) == 9
    assert resumed.report()["final_fingerprint"] == report["final_fingerprint"]


@pytest.mark.parametrize(
    ("fault", "check", "step", "rank", "node"),
    [
        ("weight-flip:4:1", "weight_vote", 4, 1, "n2"),
        ("nan:6:2", "finite", 6, 2, "n3"),
        ("sick-node:8:n3", "recompute", 8, 2, "n3"),
    ],
)
def test_drill_is_caught_by_the_intended_check(launch, fault, check, step, rank, node):
    run = run_example(launch, env={"LONGRUN_FAULTS": fault})
    assert run.rcs == [EXIT_SDC_VERDICT] * 3, run.log()
    alerts = run.alerts()
    assert len(alerts) == 1, run.log()
    alert = alerts[0]
    assert (alert["check"], alert["step"]) == (check, step), alert
    assert alert["suspect_ranks"] == [rank] and alert["suspect_nodes"] == [node], alert
    assert run.store_alerts("run") == alerts
    assert not (run.run_dir / "checkpoints" / f"step-{step:08d}").exists()  # never frozen into a checkpoint


def test_hsdp_the_example_shards_and_the_vote_names_the_flipped_node(launch):
    """LONGRUN_PARALLELISM=hsdp: the same example on a 3 x 2 mesh (two ranks per node, FSDP2 within a node):
    a weight flip on n3's first rank is named by the vote among each shard's three replicas, and the sharded
    checkpoint before it reached the store."""
    run = launch(
        ARGS, name="hsdp", nodes="n1,n1,n2,n2,n3,n3", module=MODULE, timeout_s=400.0,
        env={**ENV, "LONGRUN_PARALLELISM": "hsdp", "LONGRUN_RECOMPUTE_EVERY": "0", "LONGRUN_FAULTS": "weight-flip:5:n3"},
    )  # fmt: skip
    assert run.rcs == [EXIT_SDC_VERDICT] * 6, run.log()
    (alert,) = run.alerts()
    assert (alert["check"], alert["step"]) == ("weight_vote", 8), alert
    assert alert["suspect_ranks"] == [4] and alert["suspect_nodes"] == ["n3"], alert
    record = run.store_dir / "runs" / "hsdp" / "checkpoints" / "step-00000004" / "manifest.json"
    assert json.loads(record.read_text())["format"] == "dcp-v1"
