"""What signing costs the job and verifying costs the orchestrator, next to what they already pay.

    python bench/bench_alert_signing.py [--rounds 2000]

Job side: signing one alert record (canonical JSON + HMAC-SHA256) against writing it durably to the run
dir (`training.events.write_durably`: JSON, fsync of the file and its directory), which every alert
already pays. Orchestrator side: the HMAC check alone (`training.records.signing.verify`) against parsing the
record's JSON, which the monitor already does. Prints medians and the ratios; no Slurm or store needed
(the Slurm lookup and the key read of `longrun.alert_auth.verify_alert` are one `scontrol show job` and
one GET, the same calls the incident makes anyway).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from training.events import write_durably
from training.records import schema, signing


def _alert() -> dict:
    return schema.record(
        "alert",
        run="bench",
        step=1234,
        check="recompute",
        suspect_ranks=[5],
        suspect_nodes=["gpu-n017"],
        evidence={
            "losses": [2.0 + i / 1000 for i in range(64)],
            "fingerprints": {str(r): f"{r * 7919:016x}" for r in range(64)},
            "world": {"world_size": 64, "nodes": [f"gpu-n{i:03d}" for i in range(8)]},
        },
        job_id=4242,
    )


def _median_us(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2000)
    args = p.parse_args(argv)
    key, alert = signing.new_key(), _alert()
    signed = signing.sign(alert, key)
    text = json.dumps(signed, sort_keys=True, indent=1)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "alert.json"
        write_us = _median_us(lambda: write_durably(path, signed), max(50, args.rounds // 20))
    sign_us = _median_us(lambda: signing.sign(alert, key), args.rounds)
    verify_us = _median_us(lambda: signing.verify(signed, key), args.rounds)
    parse_us = _median_us(lambda: json.loads(text), args.rounds)
    print(f"command: python bench/bench_alert_signing.py --rounds {args.rounds}")
    print(f"alert record: {len(text)} bytes")
    print(
        f"job: sign {sign_us:.1f} us vs durable local write {write_us:.1f} us: ratio {sign_us / write_us:.3f}"
    )
    print(
        f"orchestrator: verify {verify_us:.1f} us vs JSON parse {parse_us:.1f} us: ratio {verify_us / parse_us:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
