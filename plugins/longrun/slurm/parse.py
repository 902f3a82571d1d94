"""Pure parsers for what Slurm's commands print: no processes here, so every shape is unit-tested.

Shapes handled:
- `scontrol -o show job|node`: one line per object of `Key=Value` pairs (values may hold spaces).
- `squeue -h --steps -o "%i %j"`: one `<step id> <name>` line per step of a job.
- jobcomp/filetxt: the same `Key=Value` form, one line per finished job (the durable record).
- `squeue --json`: 22.05 (`job_state` a string, numbers plain) and 23.02+ (`job_state` a list, numbers
  wrapped as `{"set", "infinite", "number"}`, `exit_code` an object).
- `sinfo --json`: 22.05 (`nodes: [{name, state, state_flags, reason}]`) and 23.02+
  (`sinfo: [{node: {state: [...]}, nodes: {nodes: [...]}, reason: {description}}]`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from longrun.slurm.models import ACTIVE, JobState, JobStep, NodeState, fold_status

_KEY_SPLIT = re.compile(r" +(?=[A-Za-z][A-Za-z0-9_/:]*=)")
_REASON_SUFFIX = re.compile(r"\s*\[[^\[\]]*@[^\[\]]*\]\s*$")
_NULLS = {"", "(null)", "None", "N/A", "n/a"}


def parse_kv_line(line: str) -> dict[str, str]:
    """`A=1 B=two words C=x=y` -> {"A": "1", "B": "two words", "C": "x=y"}."""
    out: dict[str, str] = {}
    for token in _KEY_SPLIT.split(line.strip()):
        key, sep, value = token.partition("=")
        if sep:
            out[key] = value.strip()
    return out


def text_or_none(value: str | None) -> str | None:
    """`value` stripped, or None for what Slurm prints when there is none (`(null)`, `None`, `N/A`, "")."""
    return None if value is None or value.strip() in _NULLS else value.strip()


def expand_hostlist(text: str | None) -> tuple[str, ...]:
    """`n[1-3,5],gpu07` -> (n1, n2, n3, n5, gpu07); keeps zero padding (`g[01-02]` -> g01, g02)."""
    text = text_or_none(text)
    if not text:
        return ()
    out: list[str] = []
    for token in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,\[]*", text):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", token)
        if not m:
            out.append(token)
            continue
        prefix, ranges, suffix = m.groups()
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not hi:
                out.append(f"{prefix}{lo}{suffix}")
                continue
            width = len(lo)
            out.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1))
    return tuple(out)


def parse_exit(text: str | None) -> tuple[int | None, int | None]:
    """`3:0` -> (3, None); `0:9` -> (None, 9): a signal means there is no exit code."""
    text = text_or_none(text)
    if not text:
        return None, None
    code, _, sig = text.partition(":")
    signal = int(sig) if sig.strip().isdigit() and int(sig) else None
    return (None if signal else int(code)), signal


def strip_reason(text: str | None) -> str | None:
    """Drop the `[user@time]` suffix scontrol appends to a node reason."""
    text = text_or_none(text)
    return _REASON_SUFFIX.sub("", text) or None if text else None


def split_node_state(text: str) -> tuple[str, frozenset[str]]:
    """`IDLE+DRAIN` -> ("idle", {DRAIN}); `DOWN*+DRAIN` -> ("down", {DRAIN, NOT_RESPONDING})."""
    base, *rest = text.split("+")
    flags = {f.upper() for f in rest if f}
    if base.endswith("*"):
        base = base[:-1]
        flags.add("NOT_RESPONDING")
    for marker, flag in (("~", "POWERED_DOWN"), ("#", "POWERING_UP"), ("%", "POWERING_DOWN")):
        if base.endswith(marker):
            base = base[:-1]
            flags.add(flag)
    return base.lower(), frozenset(flags)


def reason_means_held(reason: str | None) -> bool:
    """A pending job's reason says it is held (`JobHeldAdmin`, `launch_failed_requeued_held`, ...): every
    backend reads holds through this one rule, so they agree on `JobState.held`."""
    return bool(reason and (reason.startswith("JobHeld") or "held" in reason.lower()))


def job_from_kv(d: dict[str, str], *, source: str) -> JobState:
    """A job from `scontrol -o show job` or a jobcomp/filetxt line."""
    exit_code, signal = parse_exit(d.get("ExitCode"))
    slurm_state = d.get("JobState", "UNKNOWN").split()[0].upper()
    restarts = int(d.get("Restarts", "0") or 0)
    reason = text_or_none(d.get("Reason"))
    status = fold_status(slurm_state, restart_count=restarts)
    if status in ACTIVE:  # Slurm prints 0:0 until the job ends: no exit code yet
        exit_code, signal = None, None
    return JobState(
        job_id=int(d["JobId"]),
        status=status,
        slurm_state=slurm_state,
        exit_code=exit_code,
        signal=signal,
        restart_count=restarts,
        nodes=expand_hostlist(d.get("NodeList")),
        reason=reason,
        name=d.get("JobName", d.get("Name", "")),
        comment=text_or_none(d.get("Comment")) or "",
        held=slurm_state == "PENDING" and reason_means_held(reason),
        source=source,
    )


def jobs_from_scontrol(text: str) -> list[JobState]:
    return [
        job_from_kv(parse_kv_line(line), source="scontrol") for line in text.splitlines() if "JobId=" in line
    ]


def job_steps_from_squeue(text: str) -> list[JobStep]:
    """`squeue -h --steps -o "%i %j"`: one `<step id> <name>` line per step (a name may be empty)."""
    return [
        JobStep(parts[0], parts[1] if len(parts) > 1 else "")
        for parts in (line.split(None, 1) for line in text.splitlines())
        if parts
    ]


def batch_host_from_scontrol(text: str) -> str | None:
    """The `BatchHost=` of `scontrol -o show job`; None when absent, empty or `(null)` (not started)."""
    for part in text.split():
        if part.startswith("BatchHost="):
            return text_or_none(part.split("=", 1)[1])
    return None


def jobs_from_jobcomp(lines: Iterable[str]) -> dict[int, JobState]:
    """The last record per job id in a jobcomp/filetxt file (a requeued job has one line per run)."""
    out: dict[int, JobState] = {}
    for line in lines:
        if "JobId=" not in line:
            continue
        d = parse_kv_line(line)
        try:
            state = job_from_kv(d, source="jobcomp")
        except (KeyError, ValueError):
            continue  # a torn last line while slurmctld writes: skip, the next poll reads it whole
        out[state.job_id] = state
    return out


def _number(value: Any) -> int | None:
    """22.05 plain ints; 23.02+ `{"set": bool, "infinite": bool, "number": n}`."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, dict):
        if "number" in value:
            return int(value["number"]) if value.get("set", True) and not value.get("infinite") else None
        if "return_code" in value:
            return _number(value["return_code"])
    return None


def _states(value: Any) -> list[str]:
    if isinstance(value, str):
        return [s for s in value.upper().split("+") if s]
    if isinstance(value, list):
        return [str(s).upper() for s in value]
    return []


def _job_exit(job: dict[str, Any]) -> tuple[int | None, int | None]:
    raw = job.get("exit_code")
    if isinstance(raw, dict):  # 23.02+: {"status": [...], "return_code": ..., "signal": {"id": ...}}
        sig = raw.get("signal")
        signal = _number(sig.get("id") if isinstance(sig, dict) else sig)
        if signal or "SIGNALED" in _states(raw.get("status")):
            return None, signal
        return _number(raw.get("return_code")), None
    wait_status = _number(raw)  # 22.05: the raw wait(2) status (exit 3 reads 768)
    if wait_status is None:
        return None, None
    if wait_status & 0x7F:
        return None, wait_status & 0x7F
    return (wait_status >> 8) & 0xFF, None


def job_from_squeue_json(job: dict[str, Any]) -> JobState:
    states = _states(job.get("job_state"))
    slurm_state = states[0] if states else "UNKNOWN"
    restarts = _number(job.get("restart_cnt")) or 0
    exit_code, signal = _job_exit(job)
    # As scontrol: Slurm's own description of the state when it wrote one (e.g. "launch failed requeued
    # held" beside the code JobHeldUser), with underscores for spaces; else the reason code.
    description = str(job.get("state_description") or "").strip()
    reason = "_".join(description.split()) if description else text_or_none(job.get("state_reason"))
    # 22.05 reports exit 0 for jobs still running; the code is only meaningful once the job is final.
    status = fold_status(slurm_state, restart_count=restarts)
    if status in ACTIVE:
        exit_code, signal = None, None
    held = slurm_state == "PENDING" and (
        reason_means_held(reason) or "REQUEUE_HOLD" in states or job.get("hold") is True
    )
    return JobState(
        job_id=int(_number(job.get("job_id")) or 0),
        status=status,
        slurm_state=slurm_state,
        exit_code=exit_code,
        signal=signal,
        restart_count=restarts,
        nodes=expand_hostlist(job.get("nodes")),
        reason=None if reason == "None" else reason,
        name=str(job.get("name") or ""),
        comment=str(job.get("comment") or ""),
        held=held,
        flags=tuple(states[1:]),
        source="squeue-json",
    )


def jobs_from_squeue_json(data: dict[str, Any]) -> list[JobState]:
    return [job_from_squeue_json(j) for j in data.get("jobs", [])]


def nodes_from_sinfo_json(data: dict[str, Any]) -> list[NodeState]:
    """Both shapes; one NodeState per node name (23.02+ groups nodes that share a state)."""
    out: dict[str, NodeState] = {}
    if "sinfo" in data:  # 23.02+
        for entry in data["sinfo"]:
            states = _states((entry.get("node") or {}).get("state"))
            base = states[0].lower() if states else "unknown"
            flags = frozenset(states[1:])
            reason = entry.get("reason")
            text = reason.get("description") if isinstance(reason, dict) else reason
            names = (entry.get("nodes") or {}).get("nodes") or []
            for name in names:
                out[name] = NodeState(name=name, state=base, flags=flags, reason=strip_reason(text))
        return list(out.values())
    for node in data.get("nodes", []):  # 22.05
        base, flags = split_node_state(str(node.get("state", "unknown")))
        flags = flags | {str(f).upper() for f in node.get("state_flags", [])}
        name = str(node.get("name"))
        out[name] = NodeState(name=name, state=base, flags=flags, reason=strip_reason(node.get("reason")))
    return list(out.values())


def nodes_from_scontrol(text: str) -> list[NodeState]:
    out = []
    for line in text.splitlines():
        if "NodeName=" not in line:
            continue
        d = parse_kv_line(line)
        base, flags = split_node_state(d.get("State", "UNKNOWN"))
        out.append(
            NodeState(name=d["NodeName"], state=base, flags=flags, reason=strip_reason(d.get("Reason")))
        )
    return out
