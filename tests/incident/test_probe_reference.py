"""The cached probe reference as hostile input, and the verdict rules around it (no Slurm: the functions
over a local store and node_check's JSON; the Slurm round trips are in test_reference_source.py).

A cached reference is used only when it reads as one and was computed in isolation; only an isolated
reference is ever cached; a pass needs the node's own fingerprint and environment to match the reference;
against a reference that does not decide alone a pass, and a fail that rests on the probe, are
unconfirmed until a fresh isolated reference confirms them."""

from __future__ import annotations

import json

import pytest
from longrun.health import diagnose, node_check
from longrun.health.probe_reference import (
    CACHED,
    IDLE_NODE,
    RECORDED,
    RUNNING_JOB,
    UnusableReference,
    cached_reference,
    checked_reference,
    choose_reference,
    comparable,
    decides,
    how_computed,
    in_job_mark,
    isolated_mark,
    judge_fresh,
    remember_reference,
)

from training.records.diagnosis import ProbeResult
from training.store.local import LocalDirStore

KEY = "ops/probe-reference/p.json"
PROBED = {"node": "n1", "verdict": "no-reference", "fingerprint": "0123456789abcdef", "torch": "2.5.1",
          "cpu_capability": "AVX2", "threads": 1, "duration_s": 1.0, "expect": None}  # fmt: skip
GOOD = {**PROBED, "computed": isolated_mark("n1", "longrun_ref_x_n1")}  # as health.diagnose.reference
IN_JOB = {**PROBED, "computed": in_job_mark("n1", 7)}  # as hot_spare.reference_in_job


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
    other = {**GOOD, "node": "n3", "fingerprint": "fedcba9876543210", "computed": isolated_mark("n3", "r")}
    remember_reference(store, "p", other)  # a fresh reference that disagrees replaces the stored one
    assert cached_reference(store, "p") == other
    remember_reference(store, "p", {**GOOD, "fingerprint": "nothex"})  # never cached
    assert cached_reference(store, "p") == other


@pytest.mark.parametrize(
    "unmarked",
    [
        PROBED,  # no mark: cached before references were marked, or written by anyone
        IN_JOB,  # computed as a step of a job: the job could have shaped it
        {**PROBED, "computed": {**GOOD["computed"], "node": "n3"}},  # a mark for another node
        {**PROBED, "computed": {"how": "isolated", "node": "n1"}},  # no reservation named
        {**PROBED, "computed": {"how": "in_job", "node": "n1", "job_id": "7"}},
        {**PROBED, "computed": "isolated"},
    ],
)
def test_only_an_isolated_reference_is_cached_or_read_from_the_cache(tmp_path, unmarked):
    store = LocalDirStore(tmp_path)
    assert how_computed(GOOD) == "isolated" and how_computed(IN_JOB) == "in_job"
    remember_reference(store, "p", unmarked)
    assert store.head(KEY) is None  # never cached
    store.put_bytes(KEY, json.dumps(unmarked).encode())  # there anyway (an older cache, a forgery)
    assert checked_reference(unmarked, suspect="n2") is not None or unmarked is not PROBED
    assert cached_reference(store, "p", suspect="n2") is None  # not trusted
    remember_reference(store, "p", GOOD)  # and replaced by the next isolated one
    assert cached_reference(store, "p", suspect="n2") == GOOD


def test_one_choice_of_reference_fresh_isolated_first_and_in_job_never_cached(tmp_path):
    """choose_reference: a fresh isolated reference when one can be had (cached); else one recorded or
    cached, isolated only; else a fresh in-job one, which is never cached. Only the first decides."""
    store = LocalDirStore(tmp_path)
    recorded = ProbeResult.from_json(
        {**GOOD, "node": "n4", "computed": isolated_mark("n4", "longrun_ref_z_n4")}
    )
    fresh = {**GOOD, "node": "n3", "computed": isolated_mark("n3", "longrun_ref_y_n3")}
    calls: list[str] = []

    def isolated():
        calls.append("isolated")
        return fresh

    def in_job():
        calls.append("in_job")
        return IN_JOB

    def none():
        calls.append("none")
        return None

    got = choose_reference(store, "p", suspect="n2", recorded=recorded, isolated=isolated, in_job=in_job)
    assert got == (fresh, IDLE_NODE) and calls == ["isolated"] and decides(IDLE_NODE)
    assert cached_reference(store, "p") == fresh
    assert choose_reference(store, "p", suspect="n2", recorded=recorded, isolated=none) == (
        recorded.to_json(), RECORDED)  # fmt: skip
    unmarked = ProbeResult.from_json(PROBED)
    assert choose_reference(store, "p", suspect="n2", recorded=unmarked, isolated=none) == (fresh, CACHED)
    store.delete(KEY)
    calls.clear()
    got = choose_reference(store, "p", suspect="n2", recorded=unmarked, isolated=none, in_job=in_job)
    assert got == (IN_JOB, RUNNING_JOB) and calls == ["none", "in_job"]
    assert store.head(KEY) is None  # the in-job reference served this call only
    assert choose_reference(store, "p", suspect="n2", recorded=None, in_job=none) is None
    assert not any(decides(s) for s in (RECORDED, CACHED, RUNNING_JOB))
    with pytest.raises(UnusableReference):  # a fresh run that does not give its own kind
        choose_reference(store, "p", suspect="n2", recorded=None, isolated=lambda: IN_JOB)
    with pytest.raises(UnusableReference):
        choose_reference(store, "p", suspect="n2", recorded=None, in_job=lambda: {**IN_JOB, "node": "n2"})


def check(verdict: str, fingerprint: str, **env) -> dict:
    """node_check's JSON: its verdict and the probe's result (as the probe prints it, with --expect)."""
    result = {**GOOD, "node": "n2", "verdict": verdict, "fingerprint": fingerprint, "expect": "x", **env}
    return {"node": "n2", "verdict": verdict, "probe": {"verdict": verdict, "exit_code": 0, "result": result}}


def test_a_pass_or_fail_needs_the_same_environment_and_a_fresh_isolated_reference():
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
    # against a reference that does not decide alone: a pass and a probe's fail are unconfirmed...
    verdict, note = diagnose.checked_verdict(check("pass", fp), known, final=False)
    assert verdict == diagnose.UNCONFIRMED and "not confirmed" in note
    failed = check("fail", "fedcba9876543210")
    assert diagnose.checked_verdict(failed, known, final=False)[0] == diagnose.UNCONFIRMED
    # ... a fail DCGM found owes nothing to the reference, and stands
    dcgm_failed = {**failed, "dcgm": {"passed": False, "level": 3, "failures": []}}
    assert diagnose.checked_verdict(dcgm_failed, known, final=False)[0] == node_check.FAIL
    assert diagnose.checked_verdict({**failed, "dcgm": {"passed": True}}, known, final=False)[0] == (
        diagnose.UNCONFIRMED)  # fmt: skip
    # the fresh isolated reference decides, both ways
    probe = ProbeResult.from_json(check("pass", fp)["probe"]["result"])
    assert judge_fresh(probe, known)[0] == node_check.PASS
    assert judge_fresh(probe, ProbeResult.from_json({**GOOD, "fingerprint": "fedcba9876543210"}))[0] == "fail"
    assert judge_fresh(probe, ProbeResult.from_json({**GOOD, "torch": "2.4.0"}))[0] == node_check.ERROR
    assert judge_fresh(None, known)[0] == node_check.ERROR
    verdict, note = judge_fresh(probe, known, compared=known)  # the first reference was right
    assert verdict == "pass" and "was wrong" not in note
    stale = ProbeResult.from_json({**GOOD, "fingerprint": "fedcba9876543210"})  # the node "failed" on it
    verdict, note = judge_fresh(probe, known, compared=stale)
    assert verdict == "pass" and "the stored one (fedcba9876543210 on n1) was wrong" in note
    assert diagnose.verdict_reason("r", 3, diagnose.UNCONFIRMED) == "longrun:diag-unconfirmed:r:3"


def test_a_probe_run_is_comparable_only_in_the_references_environment():
    known = ProbeResult.from_json(GOOD)
    run = check("fail", "fedcba9876543210")["probe"]["result"]
    assert comparable(known, run)
    assert not comparable(known, {**run, "threads": 4})
    assert not comparable(known, {**run, "cpu_capability": "AVX512"})
    assert not comparable(known, {**run, "threads": "1"})  # does not read as a probe result
    assert not comparable(known, {})
