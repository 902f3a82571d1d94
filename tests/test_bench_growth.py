"""bench/bench_growth.py at a tiny size: its counting store counts exactly the requests it is given, and the
bench's record counts and reader reads match what the real writers put in the store (the full bench:
`python bench/bench_growth.py`, docs/scale.md). Real writers and readers, a real local-directory store;
no training, no Slurm, no Airflow."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest

from training.store.interface import NotFound
from training.store.local import LocalDirStore

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_growth.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_growth", BENCH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_counting_store_counts_each_request_by_kind_prefix_and_bytes(bench, tmp_path):
    inner = LocalDirStore(tmp_path / "store")
    store = bench.CountingStore(inner)
    for i in range(3):
        store.put_bytes(f"runs/r/checks/{i}.jsonl", b"x" * (i + 1))
    (tmp_path / "payload").write_bytes(b"y" * 10)
    store.put_file("runs/r/checkpoints/step-00000001/model.pt", tmp_path / "payload")
    assert store.get_bytes("runs/r/checks/2.jsonl") == b"xxx"
    store.download("runs/r/checkpoints/step-00000001/model.pt", tmp_path / "back")
    with pytest.raises(NotFound):
        store.get_bytes("runs/r/progress/latest.json")
    assert store.head("runs/r/checks/0.jsonl") is not None
    assert len(list(store.list("runs/r/checks/"))) == 3
    store.delete("runs/r/checks/0.jsonl")

    assert store.counts.requests == Counter(
        {
            ("put", "checks"): 3,
            ("put", "checkpoints"): 1,
            ("get", "checks"): 1,
            ("get", "checkpoints"): 1,
            ("get", "progress"): 1,
            ("head", "checks"): 1,
            ("list", "checks"): 1,
            ("delete", "checks"): 1,
        }
    )
    assert store.counts.nbytes[("put", "checks")] == 1 + 2 + 3
    assert store.counts.nbytes[("put", "checkpoints")] == 10
    assert store.counts.bytes_read() == 3 + 10
    assert store.counts.listed == Counter({"checks": 3})
    assert store.counts.list_pages() == 1
    assert store.counts.billed() == 3 + 1 + 1  # gets (the missing one too), the head, the list page
    # it delegated: the inner store holds what went through, less the deleted object
    assert sorted(i.key for i in inner.list("runs/")) == [
        "runs/r/checkpoints/step-00000001/model.pt",
        "runs/r/checks/1.jsonl",
        "runs/r/checks/2.jsonl",
    ]


def test_tiny_bench_counts_what_the_real_writers_and_readers_did(bench, tmp_path):
    ranks, days, steps, ckpts = 2, [1, 2], 40, 2  # flush every 20 steps; a checkpoint every 20 steps
    samples = bench.measure(ranks, days, steps, ckpts, tmp_path)
    assert [s.day for s in samples] == days
    last = samples[-1]
    # a batch per rank every 20 steps, and one more at each checkpoint: its save flushes the batch, and
    # the check records of the step a flush fell on go to the next batch
    batches = ranks * len(days) * (steps // 20 + ckpts)
    assert last.objects["checks"] == batches == last.writes["checks"]
    assert last.objects["checkpoints"] == len(days) * ckpts * 4  # model, optim, extra, manifest
    assert last.objects["segments"] == len(days) and last.writes["segments"] == 2 * len(days)
    assert last.objects["progress"] == 1 and last.writes["progress"] == len(days) * steps // 5
    stored = Counter(bench.prefix_of(i.key) for i in LocalDirStore(tmp_path / "store").list("runs/"))
    assert stored == last.objects  # the sample is the store's own listing, kind by kind
    # The page reads the batches of the newest RECENT_CHECK_STEPS (200) steps: here, all the run has (80
    # steps at day 2); the pick only each rank's newest.
    for s in samples:
        page, pick = s.reads["ui page"], s.reads["pick"]
        assert page.requests[("get", "checks")] == s.objects["checks"], s.day
        assert pick.requests[("get", "checks")] == ranks, (
            s.day
        )  # each rank's newest batch decides every check
        for c in (page, pick):
            assert c.requests[("list", "checks")] == 1  # one 100-step key window
            assert sum(n for (op, _p), n in c.requests.items() if op == "put") == 0  # readers only read


def test_growth_law_from_the_slopes(bench):
    assert bench.law(bench.slope([1, 2, 4], [3, 3, 3]), 0.0) == "constant"
    assert bench.law(0.0, bench.slope([1, 2, 4], [5, 10, 20])) == "steps"
    assert bench.law(bench.slope([8, 64], [8, 64]), bench.slope([1, 2], [1, 2])) == "ranks x steps"
