"""NVRx on the device: the adapter's version rules, ft_launcher with two local workers on the one GPU (a
crash and a hang recovered), and the no-restart verdict. Prints one JSON object per check on stdout.

    python bench/gpu/nvrx_check.py --out DIR            # what bench/gpu/run.sh runs
    python bench/gpu/nvrx_check.py --out DIR --launches none   # the version rules only

The rules checked are those of training.nvrx.Capabilities for the installed version: the straggler
module imports where the adapter says it is; from 0.5 a worker exiting 93 is not restarted (native); in
0.4 the adapter's workload-control shutdown request stops the restart instead.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "plugins")]

from training.nvrx import adapter as nvrx  # noqa: E402


def emit(check: str, ok: bool | None, **kw: Any) -> dict[str, Any]:
    row = {"check": check, "ok": ok, **kw}
    print(json.dumps(row), flush=True)
    return row


def version_rules() -> list[dict[str, Any]]:
    caps = nvrx.capabilities()
    rows = [emit("nvrx.version", caps.installed, version=caps.version, tested=caps.tested)]
    if not caps.installed:
        return rows
    try:
        importlib.import_module(caps.straggler_module)
        rows.append(emit("nvrx.straggler_module", True, module=caps.straggler_module))
    except Exception as e:  # a module move the adapter does not know yet
        rows.append(emit("nvrx.straggler_module", False, module=caps.straggler_module, error=repr(e)[:300]))
    for mod in (
        "nvidia_resiliency_ext.fault_tolerance",
        "nvidia_resiliency_ext.checkpointing.async_ckpt.core",
    ):
        try:
            importlib.import_module(mod)
            rows.append(emit("nvrx.import", True, module=mod))
        except Exception as e:
            rows.append(emit("nvrx.import", False, module=mod, error=repr(e)[:300]))
    return rows


def launcher() -> list[str]:
    exe = shutil.which("ft_launcher") or shutil.which("ft_launcher", path=str(Path(sys.executable).parent))
    if exe:
        return [exe]
    # A --target install puts console scripts under <target>/bin, which may not be on PATH.
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        cand = Path(entry, "bin", "ft_launcher")
        if entry and cand.exists():
            return [sys.executable, str(cand)]
    raise FileNotFoundError("ft_launcher not found on PATH or under PYTHONPATH/bin")


def launch_flags(hb_timeout_s: float) -> tuple[list[str], dict[str, str]]:
    """longrun's own ft_launcher flags and worker environment (longrun.nvrx_launch.NvrxLaunch), short timeouts."""
    from longrun.nvrx_launch import NvrxLaunch

    nl = NvrxLaunch(
        initial_heartbeat_timeout_s=120.0,
        heartbeat_timeout_s=hb_timeout_s,
        min_timeout_s=hb_timeout_s,
        workers_stop_timeout_s=10.0,
        term_timeout_s=10.0,
    )
    return nl.flags(), nl.worker_env()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_launch(out: Path, name: str, drills: str, *, hb_timeout_s: float, limit_s: float) -> dict[str, Any]:
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    flags, wenv = launch_flags(hb_timeout_s)
    cmd = [
        *launcher(),
        "--nnodes=1",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        f"--rdzv-id=gpu-check-{name}",
        "--max-restarts=3",
        *flags,
        str(REPO / "bench/gpu/ft_worker.py"),
        f"--dir={d}",
        f"--drills={drills}",
    ]
    env = {**os.environ, **wenv, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "plugins"), env.get("PYTHONPATH", "")])
    t0 = time.time()
    with (d / "launcher.log").open("w") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            rc = None
    events = []
    if (d / "events.jsonl").exists():
        events = [json.loads(x) for x in (d / "events.jsonl").read_text().splitlines() if x.strip()]
    return {"rc": rc, "wall_s": round(time.time() - t0, 1), "events": events, "log": str(d / "launcher.log")}


def recovery_s(events: list[dict[str, Any]], fault: str, next_inc: int) -> float | None:
    t_fault = next((e["t"] for e in events if e["event"] == fault), None)
    t_back = [e["t"] for e in events if e["event"] == "start" and e["incarnation"] == next_inc]
    if t_fault is None or len(t_back) < 2:
        return None
    return round(max(t_back) - t_fault, 2)


def launches(out: Path, hb_timeout_s: float) -> list[dict[str, Any]]:
    rows = []
    r = run_launch(out, "crash-hang", "crash,hang", hb_timeout_s=hb_timeout_s, limit_s=240)
    ev = r["events"]
    incs = sorted({e["incarnation"] for e in ev if e["event"] == "start"})
    done = [e for e in ev if e["event"] == "done"]
    rows.append(emit("ft_launcher.crash_recovered", 1 in incs, recovery_s=recovery_s(ev, "crash", 1),
                     log=r["log"]))  # fmt: skip
    rows.append(emit("ft_launcher.hang_recovered", 2 in incs and len(done) == 2 and r["rc"] == 0,
                     recovery_s=recovery_s(ev, "hang", 2), rc=r["rc"], incarnations=incs,
                     device=next((e["device"] for e in ev if e["event"] == "start"), None)))  # fmt: skip
    caps = nvrx.capabilities()
    v = run_launch(out, "verdict", "verdict", hb_timeout_s=hb_timeout_s, limit_s=120)
    ev = v["events"]
    incs = sorted({e["incarnation"] for e in ev if e["event"] == "start"})
    sent = next((e.get("request_sent") for e in ev if e["event"] == "verdict"), None)
    rows.append(emit("ft_launcher.verdict_not_restarted", incs == [0] and v["rc"] not in (0, None),
                     rc=v["rc"], incarnations=incs, shutdown_request_sent=sent,
                     native_no_restart_exit=caps.native_no_restart_exit))  # fmt: skip
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--launches", choices=("all", "none"), default="all")
    p.add_argument("--hb-timeout-s", type=float, default=8.0)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = version_rules()
    if args.launches == "all" and rows[0]["ok"]:
        try:
            rows += launches(args.out, args.hb_timeout_s)
        except Exception as e:  # report, do not hide the other sections' figures
            rows.append(emit("ft_launcher", False, error=repr(e)[:500]))
    (args.out / "nvrx_check.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
