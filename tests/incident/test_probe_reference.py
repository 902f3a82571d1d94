"""The cached probe reference as hostile input, and the verdict rules around it (no Slurm: the functions
over a local store and node_check's JSON; the Slurm round trips are in test_reference_source.py).

A cached reference is used only when it reads as one; a pass needs the node's own fingerprint and
environment to match the reference; against a stored reference a pass is pending (error) until a fresh
reference confirms it."""

from __future__ import annotations

import json

import pytest
from longrun.health import diagnose, node_check
from longrun.health.probe_reference import (
    cached_reference,
    checked_reference,
    comparable,
    judge_fresh,
    remember_reference,
)

from training.records.diagnosis import ProbeResult
from training.store.local import LocalDirStore

KEY = "ops/probe-reference/p.json"
GOOD = {"node": "n1", "verdict": "no-reference", "fingerprint": "0123456789abcdef", "torch": "2.5.1",
        "cpu_capability": "AVX2", "threads": 1, "duration_s": 1.0, "expect": None}  # fmt: skip


@pytest.mark.parametrize(
    "bad",
    [
        None,
        [],
        "0123456789abcdef",
        {**GOOD, "fingerprint": "0123456789ABCDEF"},  # not the probe's lower-case hex
        {**GOOD, "fingerprint": "0123"},
        {**GOOD, "fingerprint": 123},  # wrong type
        {**GOOD, "verdict": "pass"},  # a run with --expect: not a reference run
        {**GOOD, "node": "n2"},  # computed on the suspect itself
        {**GOOD, "node": "-n1"},
        {**GOOD, "torch": None},  # environment missing
        {k: v for k, v in GOOD.items() if k != "threads"},
        {**GOOD, "threads": "1"},
    ],
)
def test_what_does_not_read_as_a_reference_is_never_used(tmp_path, bad):
    assert checked_reference(GOOD, suspect="n2") is not None
    assert checked_reference(bad, suspect="n2") is None
    store = LocalDirStore(tmp_path)
    store.put_bytes(KEY, json.dumps(bad).encode())
    assert cached_reference(store, "p", suspect="n2") is None


def test_a_garbled_or_wrong_cached_reference_is_replaced_by_a_fresh_one(tmp_path):
    store = LocalDirStore(tmp_path)
    assert cached_reference(store, "p") is None
    store.put_bytes(KEY, b"\x00{garbled")
    assert cached_reference(store, "p") is None
    remember_reference(store, "p", GOOD)
    assert cached_reference(store, "p") == GOOD
    other = {**GOOD, "node": "n3", "fingerprint": "fedcba9876543210"}
    remember_reference(store, "p", other)  # a fresh reference that disagrees replaces the stored one
    assert cached_reference(store, "p") == other
    remember_reference(store, "p", {**GOOD, "fingerprint": "nothex"})  # never cached
    assert cached_reference(store, "p") == other


def check(verdict: str, fingerprint: str, **env) -> dict:
    """node_check's JSON: its verdict and the probe's result (as the probe prints it, with --expect)."""
    result = {**GOOD, "node": "n2", "verdict": verdict, "fingerprint": fingerprint, "expect": "x", **env}
    return {"node": "n2", "verdict": verdict, "probe": {"verdict": verdict, "exit_code": 0, "result": result}}


def test_a_pass_needs_the_same_fingerprint_and_environment_and_a_fresh_reference():
    known = ProbeResult.from_json(GOOD)
    fp = GOOD["fingerprint"]
    assert diagnose.checked_verdict(check("pass", fp), known)[0] == node_check.PASS
    assert diagnose.checked_verdict(check("fail", "fedcba9876543210"), known)[0] == node_check.FAIL
    # node_check says pass, but its probe did not compute the reference's fingerprint, or elsewhere
    assert diagnose.checked_verdict(check("pass", "fedcba9876543210"), known)[0] == node_check.ERROR
    assert diagnose.checked_verdict(check("pass", fp, torch="2.4.0"), known)[0] == node_check.ERROR
    assert (
        diagnose.checked_verdict(check("fail", "fedcba9876543210", threads=4), known)[0] == node_check.ERROR
    )
    # against a stored reference: a pass is pending, a fail stands
    verdict, note = diagnose.checked_verdict(check("pass", fp), known, stored=True)
    assert verdict == node_check.ERROR and "not confirmed" in note
    assert diagnose.checked_verdict(check("fail", "fedcba9876543210"), known, stored=True)[0] == "fail"
    # the fresh reference decides
    probe = ProbeResult.from_json(check("pass", fp)["probe"]["result"])
    assert judge_fresh(probe, known)[0] == node_check.PASS
    assert judge_fresh(probe, ProbeResult.from_json({**GOOD, "fingerprint": "fedcba9876543210"}))[0] == "fail"
    assert judge_fresh(probe, ProbeResult.from_json({**GOOD, "torch": "2.4.0"}))[0] == node_check.ERROR
    assert judge_fresh(None, known)[0] == node_check.ERROR


def test_a_probe_run_is_comparable_only_in_the_references_environment():
    known = ProbeResult.from_json(GOOD)
    run = check("fail", "fedcba9876543210")["probe"]["result"]
    assert comparable(known, run)
    assert not comparable(known, {**run, "threads": 4})
    assert not comparable(known, {**run, "cpu_capability": "AVX512"})
    assert not comparable(known, {**run, "threads": "1"})  # does not read as a probe result
    assert not comparable(known, {})
