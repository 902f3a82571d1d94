"""The diagnosis part of an incident record, as the diagnose step returns it and the record keeps it: the
step's verdict, node_check's JSON (`details`) and the replay probe's JSON inside it; a probe's JSON is
also the diagnosis' reference. Reading and writing: `Part` in training/records/base.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from training.records.base import PART, Part
from training.records.fields import opt_bool, opt_float, opt_int, opt_job_id, opt_obj, opt_str, while_set


@PART
class ProbeResult(Part):
    """The replay probe's JSON (training.probe): on the suspect node, or on a healthy one as the
    reference."""

    PART = "probe result"
    node: str | None = None
    verdict: str | None = None
    """`pass`, `fail` or `no-reference`."""
    fingerprint: str | None = None
    expect: str | None = None
    """The fingerprint it was given to expect."""
    expected: str | None = None
    """`expect` as older probes named it."""
    duration_s: float | None = None
    torch: str | None = None
    cpu_capability: str | None = None
    threads: int | None = None

    FIELDS = while_set(
        node=opt_str,
        verdict=opt_str,
        fingerprint=opt_str,
        expect=opt_str,
        expected=opt_str,
        duration_s=opt_float,
        torch=opt_str,
        cpu_capability=opt_str,
        threads=opt_int,
    )

    @property
    def env(self) -> tuple[str | None, str | None, int | None]:
        """What a reference must share with the probe run it is compared with (torch, CPU level,
        threads)."""
        return (self.torch, self.cpu_capability, self.threads)

    @property
    def expected_fingerprint(self) -> str | None:
        return self.expect or self.expected


@PART
class Probe(Part):
    """node_check's run of the probe: its verdict, exit code and JSON."""

    PART = "probe"
    verdict: str | None = None
    exit_code: int | None = None
    result: ProbeResult | None = None
    error: str | None = None
    stderr_tail: str | None = None

    FIELDS = while_set(
        verdict=opt_str, exit_code=opt_int, result=ProbeResult.read, error=opt_str, stderr_tail=opt_str
    )


@PART
class NodeCheck(Part):
    """node_check's JSON: the node's verdict, the probe and DCGM's result (None: dcgmi absent). When
    node_check printed nothing, the verdict is `error` with the output's tails."""

    PART = "diagnosis details"
    node: str | None = None
    verdict: str | None = None
    probe: Probe | None = None
    dcgm: Mapping[str, Any] | None = None
    """DCGM's verdict as longrun.health.dcgm writes it (read by `dcgm.describe`)."""
    stdout_tail: str | None = None
    stderr_tail: str | None = None

    FIELDS = while_set(
        node=opt_str,
        verdict=opt_str,
        probe=Probe.read,
        dcgm=opt_obj,
        stdout_tail=opt_str,
        stderr_tail=opt_str,
    )

    @property
    def probe_result(self) -> ProbeResult:
        """The probe's JSON (the empty one when the probe gave none)."""
        return (self.probe.result if self.probe else None) or ProbeResult()


@PART
class Diagnosis(Part):
    """The diagnose step's result and the record's `diagnosis`; `observe` marks observe mode's
    would-be result (only `node` besides)."""

    PART = "diagnosis"
    node: str | None = None
    verdict: str | None = None
    """`pass`, `fail`, `error`, or `unconfirmed` (a pass or fail nothing computed in isolation confirmed)."""
    reason: str | None = None
    """The drain reason the node carries afterwards."""
    summary: str | None = None
    runbook: str | None = None
    duration_s: float | None = None
    exit_code: int | None = None
    details: NodeCheck | None = None
    reference_node: str | None = None
    dcgm_level: int | None = None
    total_s: float | None = None
    where: str | None = None
    """`in_job` when it was decided inside the kept job (only `unconfirmed`: the node could not leave the
    job); absent for the reservation path."""
    job_id: int | str | None = None
    observe: bool | None = None

    FIELDS = while_set(
        node=opt_str,
        verdict=opt_str,
        reason=opt_str,
        summary=opt_str,
        runbook=opt_str,
        duration_s=opt_float,
        exit_code=opt_int,
        details=NodeCheck.read,
        reference_node=opt_str,
        dcgm_level=opt_int,
        total_s=opt_float,
        where=opt_str,
        job_id=opt_job_id,
        observe=opt_bool,
    )

    @property
    def checked(self) -> NodeCheck:
        """node_check's JSON (the empty one when the diagnosis has none)."""
        return self.details or NodeCheck()


@dataclass(frozen=True, slots=True, kw_only=True)
class DcgmFailed:
    """One failing result of `DcgmSummary`: the test and GPU as written (None: not written)."""

    test: Any = None
    gpu: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DcgmSummary:
    """What a reader that must not fail takes from DCGM's verdict as longrun.health.dcgm writes it
    (`DcgmVerdict.to_dict`, node_check's `dcgm`, `NodeCheck.dcgm`): the values as written, for people.
    The whole verdict is longrun.health.dcgm's `DcgmVerdict`."""

    passed: bool = False
    """True only when the verdict says `"passed": true`: anything else never passes a node."""
    level: Any = None
    tests_run: Any = 0
    """As written; absent: 0."""
    runtime_error: Any = None
    failed: tuple[DcgmFailed, ...] = ()
    """The results with status `fail`, in order (warnings left out)."""
    overall_result: Any = None

    @classmethod
    def shown(cls, obj: Any) -> Self:
        """Never raises: a verdict that is not an object reads as one that did not pass and names
        nothing; a `failures` entry that is not an object is skipped."""
        if not isinstance(obj, Mapping):
            return cls()
        failures = obj.get("failures")
        return cls(
            passed=obj.get("passed") is True,
            level=obj.get("level"),
            tests_run=obj.get("tests_run", 0),
            runtime_error=obj.get("runtime_error"),
            failed=tuple(
                DcgmFailed(test=f.get("test"), gpu=f.get("gpu"))
                for f in (failures if isinstance(failures, list | tuple) else ())
                if isinstance(f, Mapping) and f.get("status") == "fail"
            ),
            overall_result=obj.get("overall_result"),
        )


__all__ = ["DcgmFailed", "DcgmSummary", "Diagnosis", "NodeCheck", "Probe", "ProbeResult"]
