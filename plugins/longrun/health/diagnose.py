"""Isolate and diagnose a suspect node through the Slurm layer.

drain_suspect   drain with longrun's reason, unless the node is already drained by us (never twice)
reference       the probe's known-good fingerprint, computed on a healthy idle node (MAINT reservation,
                so nothing else lands there meanwhile)
diagnose        `node_check` (probe, + DCGM where installed) on the drained node through
                `ops.run_on_drained_node`, which drains it again with the verdict as the new reason

Drain reasons (all carry longrun's prefix, so only longrun ever resumes them):
    longrun:sdc:<run>:<step>               drained on an alert, diagnosis pending
    longrun:diag-fail:<run>:<step>         the diagnostic failed: RMA path (runbooks/diagnostic-failed.md)
    longrun:diag-pass:<run>:<step>         the diagnostic passed: a person decides (diagnostic-passed.md)
    longrun:diag-error:<run>:<step>        the diagnostic could not run: stays drained, retry it
    longrun:diag-unconfirmed:<run>:<step>  a pass or fail nothing computed in isolation confirmed (the
                                           reference was read back or computed in a job, or the probe ran
                                           inside the suspect's job): a person decides (diagnostic-failed.md)
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from longrun.health import dcgm, node_check
from longrun.health.probe_reference import confirms, isolated_mark, run_reference
from longrun.runbooks import runbook_path
from longrun.slurm import ops
from longrun.slurm import validate as v
from longrun.slurm.client import SlurmClient
from longrun.slurm.errors import ForeignDrainError
from longrun.slurm.models import CommandResult, NodeState
from longrun.slurm.srun_step import TIMED_OUT
from training.records.diagnosis import DcgmSummary, NodeCheck, ProbeResult
from training.records.schema import SchemaError

log = logging.getLogger("longrun.health.diagnose")

SDC = "sdc"
DIAG = "diag"
#: The orchestrator's verdict on a pass or fail it could not confirm in isolation (node_check's own
#: verdicts are pass, fail and error): not a conviction, not a clearance; the node stays drained.
UNCONFIRMED = "unconfirmed"
#: Every verdict a diagnosis (and a `diagnosed` node event) may carry.
VERDICTS = (node_check.PASS, node_check.FAIL, node_check.ERROR, UNCONFIRMED)


def _reason(kind: str, run: str, step: int) -> str:
    return v.reason("reason", f"{v.DRAIN_PREFIX}{kind}:{run}:{step}"[:256], ours=True)


def sdc_reason(run: str, step: int) -> str:
    """The reason of the first drain, on an alert."""
    return _reason(SDC, run, step)


def verdict_reason(run: str, step: int, verdict: str) -> str:
    """The reason after the diagnosis: the verdict is part of it, so `sinfo -R` tells the story."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict={verdict!r}: expected one of {VERDICTS}")
    return _reason(f"{DIAG}-{verdict}", run, step)


def verdict_runbook(verdict: str) -> str:
    """The runbook a diagnosis links: diagnostic-passed on a pass, else diagnostic-failed (a failure, no
    verdict, or an unconfirmed one: the node stays drained either way). Both diagnosis paths use it (the
    MAINT reservation, the kept job's step)."""
    return runbook_path("diagnostic_passed" if verdict == node_check.PASS else "diagnostic_failed")


def parse_reason(reason: str | None) -> tuple[str, str, int] | None:
    """(kind, run, step) from one of our reasons, or None."""
    if not reason or not reason.startswith(v.DRAIN_PREFIX):
        return None
    parts = reason[len(v.DRAIN_PREFIX) :].split(":")
    if len(parts) != 3 or not parts[2].isdigit():
        return None
    return parts[0], parts[1], int(parts[2])


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainOutcome:
    """What draining did."""

    node: str
    """The node."""
    drained_now: bool
    """False when it was already drained by longrun (a rerun, or another incident's drain)."""
    reason: str
    """The reason on the node afterwards."""


def drain_suspect(client: SlurmClient, *, node: str, reason: str) -> DrainOutcome:
    """Drain `node` unless it already carries one of longrun's reasons. A foreign drain is left alone."""
    state = client.node(node)
    if state.drain_flag:
        if state.is_ours:
            return DrainOutcome(node=node, drained_now=False, reason=state.reason or "")
        raise ForeignDrainError(
            f"node {node} is already drained by someone else (reason {state.reason!r}); longrun leaves it"
        )
    client.drain(node, reason)
    return DrainOutcome(node=node, drained_now=True, reason=reason)


@dataclass(frozen=True, slots=True, kw_only=True)
class DiagnosisOutcome:
    """The outcome of diagnosing one node; `to_dict` goes into the record's `diagnosis`, read back as
    training.records.Diagnosis."""

    node: str
    """The node."""
    verdict: str
    """pass, fail or error."""
    reason: str
    """The drain reason the node carries afterwards."""
    summary: str
    """One line for people."""
    runbook: str
    """What to do next."""
    duration_s: float
    """Wall time of the whole round trip (reservation, resume, run, drain, delete)."""
    exit_code: int
    """node_check's exit code (srun's)."""
    details: dict[str, Any] = field(default_factory=dict)
    """node_check's JSON (probe result, DCGM verdict)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "verdict": self.verdict,
            "reason": self.reason,
            "summary": self.summary,
            "runbook": self.runbook,
            "duration_s": round(self.duration_s, 3),
            "exit_code": self.exit_code,
            "details": self.details,
        }


def node_check_argv(
    *,
    node: str,
    expect: str | None,
    dcgm_level: int,
    probe_timeout_s: float,
    python: str | None = None,
    state_dir: str | None = None,
) -> tuple[str, ...]:
    v.node("node", node)
    argv = [python or sys.executable, "-m", "longrun.health.node_check", "--node", node]
    if expect:
        if not all(c in "0123456789abcdefABCDEF" for c in expect) or len(expect) > 128:
            raise ValueError(f"expect={expect!r}: must be a hex fingerprint")
        argv += ["--expect", expect]
    argv += ["--dcgm-level", str(dcgm_level), "--probe-timeout", str(probe_timeout_s)]
    if state_dir:
        argv += ["--state-dir", v.path("state_dir", state_dir)]
    return tuple(argv)


def _details(result: CommandResult) -> dict[str, Any]:
    obj = node_check.last_json_line(result.stdout)
    if obj is None:
        return {
            "verdict": node_check.ERROR,
            "stdout_tail": result.stdout[-2000:],
            "stderr_tail": result.stderr[-2000:],
        }
    return obj


def summarize(node: str, d: NodeCheck) -> str:
    """One line for people from node_check's JSON: the verdict, the probe's fingerprints, DCGM's result.
    Both diagnosis paths use it (the MAINT reservation here, the kept job's step in
    longrun.incident.hot_spare)."""
    res = d.probe_result
    parts = [f"{node}: {d.verdict}", f"probe {d.probe.verdict if d.probe else None}"]
    if res.fingerprint:
        parts.append(f"fingerprint {res.fingerprint} (expected {res.expected_fingerprint})")
    parts.append(dcgm.describe(d.dcgm))
    return "; ".join(parts)


def checked_verdict(
    seen: Mapping[str, Any], known: ProbeResult | None, *, final: bool = True
) -> tuple[str, str]:
    """node_check's verdict as longrun takes it, and a note for the summary. Against a reference, a pass
    needs the probe's own fingerprint and environment to match it, and a fail in another environment is
    not comparable: both are `error` (no verdict, the node stays drained). Against a reference that is not
    `final` (not computed in isolation by this try: probe_reference.decides), a pass, and a fail that
    rests on the probe alone, are UNCONFIRMED until a fresh isolated reference confirms them
    (longrun.incident.reference_source.confirm); a fail DCGM found stands, it owes nothing to the
    reference."""
    outcome = str(seen.get("verdict", node_check.ERROR))
    if outcome not in (node_check.PASS, node_check.FAIL) or known is None:
        return (outcome if outcome in (node_check.PASS, node_check.FAIL) else node_check.ERROR), ""
    try:
        checked = NodeCheck.from_json(dict(seen))
    except SchemaError:
        return node_check.ERROR, "; node_check's JSON does not read"
    probe = checked.probe_result
    if outcome == node_check.FAIL and probe and known.env != probe.env:
        return node_check.ERROR, f"; reference environment {list(known.env)} differs: not comparable"
    if outcome == node_check.PASS and not confirms(known, probe):
        return node_check.ERROR, "; the probe does not match the reference's fingerprint and environment"
    dcgm_failed = checked.dcgm is not None and not DcgmSummary.shown(checked.dcgm).passed
    if not final and not (outcome == node_check.FAIL and dcgm_failed):
        return UNCONFIRMED, f"; a {outcome} against a reference not computed in isolation now: not confirmed"
    return outcome, ""


#: Tries of a diagnostic whose node_check never answered (`diagnose`).
ATTEMPTS = 2


def _run_node_check(
    client: SlurmClient,
    node: str,
    argv: tuple[str, ...],
    *,
    run: str,
    step: int,
    known: ProbeResult | None,
    final: bool,
    timeout_s: float,
    reservation: str,
    hold_min: int | None,
) -> tuple[CommandResult, dict[str, Any]]:
    """One try: node_check in the reservation; the node ends drained with its verdict. Returns the command's
    result and node_check's JSON (or what stands for it when none came)."""
    seen: dict[str, Any] = {}

    def verdict(result: CommandResult) -> str:
        seen.update(_details(result))
        return verdict_reason(run, step, checked_verdict(seen, known, final=final)[0])

    result = ops.run_on_drained_node(
        client, node, argv, verdict=verdict, timeout_s=timeout_s, reservation=reservation, hold_min=hold_min
    )
    if not seen:  # run_on_drained_node calls verdict() only when the command ran
        seen.update(_details(result))
    return result, seen


def diagnose(
    client: SlurmClient,
    *,
    node: str,
    run: str,
    step: int,
    expect: str | None,
    dcgm_level: int,
    timeout_s: float = 600.0,
    python: str | None = None,
    state_dir: str | None = None,
    reservation: str | None = None,
    hold_min: int | None = None,
    known: ProbeResult | None = None,
    final: bool = True,
) -> DiagnosisOutcome:
    """Run node_check on the drained `node` in a MAINT reservation; the node ends drained with the verdict
    (`checked_verdict` against `known`, the reference, when given; `final`: whether it decides alone).

    A diagnostic whose node_check never answered (no JSON line: the command was cut off, as srun is when
    slurmctld restarts under it; seen in the fault matrix, re-enter x slurmctld) says nothing about the node,
    so it runs once more (`ATTEMPTS`) before `error` is its verdict; not one that answered, or that ran to
    its timeout (a hang says something, and a second would double the wait)."""
    argv = node_check_argv(
        node=node,
        expect=expect,
        dcgm_level=dcgm_level,
        probe_timeout_s=max(30.0, timeout_s - 30),
        python=python,
        state_dir=state_dir,
    )
    started = time.monotonic()
    cut_off: list[str] = []
    for attempt in range(1, ATTEMPTS + 1):
        result, seen = _run_node_check(
            client, node, argv, run=run, step=step, known=known, final=final, timeout_s=timeout_s,
            reservation=reservation or f"longrun_diag_{node}_{int(time.time())}", hold_min=hold_min,
        )  # fmt: skip
        if "probe" in seen or result.exit_code == TIMED_OUT or attempt == ATTEMPTS:
            break  # node_check answered, or ran to its timeout (a hang is evidence, and a second costs as much)
        cut_off.append(f"exit {result.exit_code}")
        log.warning(
            "the diagnostic on %s never answered (exit %s, stderr %.300r): running it once more",
            node,
            result.exit_code,
            result.stderr[-300:],
        )
    outcome, note = checked_verdict(seen, known, final=final)
    if cut_off:
        note += f"; an earlier try never answered ({', '.join(cut_off)}) and was run again"
    return DiagnosisOutcome(
        node=node,
        verdict=outcome,
        reason=verdict_reason(run, step, outcome),
        summary=summarize(node, NodeCheck.from_json(seen)) + note,
        runbook=verdict_runbook(outcome),
        duration_s=time.monotonic() - started,
        exit_code=result.exit_code,
        details=seen,
    )


def pick_healthy(
    nodes: Sequence[NodeState], *, exclude: Sequence[str], prefer: Sequence[str] = ()
) -> str | None:
    """An idle node that is not drained, down or excluded; nodes in `prefer` first (the run's own)."""
    ok = [
        n.name
        for n in nodes
        if n.state == "idle"
        and not n.drain_flag
        and not n.is_down
        and n.name not in exclude
        and not n.flags & {"RESERVED", "MAINTENANCE"}
    ]
    for name in prefer:
        if name in ok:
            return name
    return ok[0] if ok else None


def reference(
    client: SlurmClient,
    *,
    node: str,
    timeout_s: float = 300.0,
    python: str | None = None,
    state_dir: str | None = None,
    reservation: str | None = None,
) -> dict[str, Any]:
    """The probe's fingerprint on a healthy idle `node`, computed in isolation: by a job of its own in a
    short MAINT reservation (so nothing else lands on the node meanwhile), marked so
    (probe_reference.isolated_mark). Returns the probe's JSON verdict (with `fingerprint`);
    probe_reference.NoReference (a SlurmCommandError) when the probe gives none."""
    name = reservation or f"longrun_ref_{node}_{int(time.time())}"
    client.create_maint_reservation(name, (node,), duration_min=int(timeout_s // 60) + 5)
    try:
        return run_reference(
            lambda argv: client.run_in_reservation(name, node, argv, timeout_s=timeout_s),
            computed=isolated_mark(node, name),
            python=python,
            state_dir=state_dir,
        )
    finally:
        client.delete_reservation(name)
