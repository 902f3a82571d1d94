"""The diagnostic that runs ON the suspect node (inside the MAINT reservation): probe, then DCGM if present.

`python -m longrun.health.node_check --node N [--expect HEX] [--dcgm-level L]` runs longrun's replay
probe (`python -m training.probe`), then `dcgmi diag -r L -j` when `dcgmi` is on the node's PATH, and
prints one JSON line: {"node", "verdict": pass|fail|error, "probe": {...}, "dcgm": {...} or null}.
Exit code 0 on pass, 1 on fail, 2 when the diagnostic itself could not run. One srun, one reservation
round trip, whatever the node has installed. No Airflow and no torch in this process (the probe is a
child process), so it starts fast on a compute node.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from typing import Any

from longrun.health import dcgm
from training.records.diagnosis import DcgmSummary

PASS, FAIL, ERROR = "pass", "fail", "error"


def last_json_line(text: str) -> dict[str, Any] | None:
    """The last line of `text` that is a JSON object (tools print logs before their verdict)."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                return obj
    return None


def probe_verdict(obj: dict[str, Any] | None, exit_code: int) -> str:
    """pass / fail / error from the probe's JSON verdict (and its exit code when the JSON says nothing)."""
    if obj is None:
        return ERROR
    for key in ("verdict", "status", "result"):
        value = obj.get(key)
        if isinstance(value, str) and value.lower() in (PASS, FAIL, ERROR):
            return value.lower()
        if isinstance(value, str) and value.lower() == "no-reference":
            return ERROR  # nothing to compare with: not a verdict on the node
    for key in ("ok", "passed", "match"):
        if isinstance(obj.get(key), bool):
            return PASS if obj[key] else FAIL
    return PASS if exit_code == 0 else FAIL


def run_probe(
    node: str, expect: str | None, timeout_s: float, state_dir: str | None = None
) -> dict[str, Any]:
    argv = [sys.executable, "-m", "training.probe", "--node", node]
    if expect:
        argv += ["--expect", expect]
    if state_dir:
        argv += ["--state-dir", state_dir]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"verdict": ERROR, "error": f"probe timed out after {timeout_s} s"}
    obj = last_json_line(proc.stdout)
    return {
        "verdict": probe_verdict(obj, proc.returncode),
        "exit_code": proc.returncode,
        "result": obj,
        "stderr_tail": proc.stderr[-2000:],
    }


def run_dcgm(level: int, timeout_s: float) -> dict[str, Any] | None:
    if shutil.which("dcgmi") is None:
        return None  # DCGM is not installed on this node: the probe carries the diagnosis
    try:
        proc = subprocess.run(
            dcgm.command(level), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return {"passed": False, "runtime_error": f"dcgmi diag timed out after {timeout_s} s", "level": level}
    try:
        return dcgm.parse(proc.stdout, level=level).to_dict()
    except dcgm.DcgmParseError as e:
        return {"passed": False, "runtime_error": f"unparseable dcgmi output (rc {proc.returncode}): {e}"}


def combine(probe: dict[str, Any], dcgm_result: dict[str, Any] | None) -> str:
    """The node's verdict: a failing probe or a failing DCGM run fails it; a probe that could not run is
    an error unless DCGM failed anyway."""
    dcgm_failed = dcgm_result is not None and not DcgmSummary.shown(dcgm_result).passed
    if probe["verdict"] == FAIL or dcgm_failed:
        return FAIL
    if probe["verdict"] == ERROR:
        return ERROR
    return PASS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m longrun.health.node_check", description=__doc__)
    p.add_argument(
        "--node", required=True, help="this node's name (the probe's sick-node marker is per node)"
    )
    p.add_argument("--expect", default=None, help="known-good probe fingerprint from a healthy node")
    p.add_argument("--dcgm-level", type=int, default=3, choices=dcgm.LEVELS)
    p.add_argument("--probe-timeout", type=float, default=300.0)
    p.add_argument("--dcgm-timeout", type=float, default=3600.0)
    p.add_argument("--state-dir", default=None, help="fault state dir (drills: where sick-node markers live)")
    args = p.parse_args(argv)
    probe = run_probe(args.node, args.expect, args.probe_timeout, args.state_dir)
    dcgm_result = run_dcgm(args.dcgm_level, args.dcgm_timeout)
    verdict = combine(probe, dcgm_result)
    print(
        json.dumps(
            {"node": args.node, "verdict": verdict, "probe": probe, "dcgm": dcgm_result}, sort_keys=True
        )
    )
    return {PASS: 0, FAIL: 1}.get(verdict, 2)


if __name__ == "__main__":
    sys.exit(main())
