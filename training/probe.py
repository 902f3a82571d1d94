"""The deterministic replay probe: a seeded workload whose fingerprint is compared with a known-good one.

    python -m training.probe --node n2 --expect 5b0c...   # prints one JSON verdict; exit 1 on mismatch

The incident DAG runs it on a drained node. The workload is the trainer's own model code (forward,
backward, a few AdamW steps on seeded data), single process, one thread, so its bits depend only on the
hardware and the pinned software (torch version, ATEN_CPU_CAPABILITY, thread count, all echoed in the
output). The known-good fingerprint comes from running the same command on a healthy node of the same
kind (without --expect the verdict is `no-reference`, exit 0).

A simulated sick node (fault `sick-node`) is seen here too: its marker file
<LONGRUN_FAULT_STATE_DIR>/sick-nodes/<node> switches on the same perturbation of every `nn.Linear` output as in training.

Exit codes: 0 pass or no reference; 1 mismatch (the node computes differently); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import xxhash

from training.config import ModelConfig
from training.data import micro_batch
from training.faults import node_is_sick, perturb_linear_outputs
from training.fingerprint.host import fingerprint_tensor, hex64
from training.model import build_model

PROBE_SEED = 20261129
PROBE_MODEL = ModelConfig(vocab_size=512, d_model=128, n_layers=2, n_heads=4, seq_len=64, batch_size=8)


def run_probe(*, sick: bool, steps: int = 4) -> str:
    """Fingerprint of the losses, gradients and weights of a short seeded training run."""
    torch.set_num_threads(1)
    model = build_model(PROBE_MODEL, seed=PROBE_SEED)
    if sick:
        perturb_linear_outputs(model, lambda: True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    h = xxhash.xxh3_64()
    for step in range(1, steps + 1):
        batch = micro_batch(PROBE_MODEL, seed=PROBE_SEED, step=step, rank=0)
        loss = model.loss(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        parts = [loss.detach()] + [p.grad for p in model.parameters() if p.grad is not None]
        for t in parts:
            h.update(hex64(fingerprint_tensor(t)).encode())
        opt.step()
    for p in model.parameters():
        h.update(hex64(fingerprint_tensor(p)).encode())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--node", required=True, help="the node this runs on (names its sick-node marker)")
    p.add_argument("--expect", default=os.environ.get("LONGRUN_PROBE_EXPECT"), help="known-good hex")
    p.add_argument("--state-dir", default=os.environ.get("LONGRUN_FAULT_STATE_DIR"), help="fault state dir")
    args = p.parse_args(argv)
    if args.expect is not None and (
        len(args.expect) != 16 or any(c not in "0123456789abcdef" for c in args.expect)
    ):
        print(f"--expect {args.expect!r} is not a 16-digit lower-case hex fingerprint", file=sys.stderr)
        return 2
    sick = bool(args.state_dir) and node_is_sick(Path(args.state_dir), args.node)
    t0 = time.perf_counter()
    fp = run_probe(sick=sick)
    verdict = "no-reference" if args.expect is None else ("pass" if fp == args.expect else "fail")
    out: dict[str, Any] = {
        "node": args.node,
        "verdict": verdict,
        "fingerprint": fp,
        "expect": args.expect,
        "duration_s": round(time.perf_counter() - t0, 3),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(out, sort_keys=True))
    return 1 if verdict == "fail" else 0


if __name__ == "__main__":
    sys.exit(main())
