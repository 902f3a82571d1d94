"""Loops that are not the reference trainer, end to end through Airflow on the local stack (issue 26).

Two entrypoints go through `training_run` exactly as a user's would, each guarded by the public job-side
API (training.api):

- `module:training.examples.hf_gpt2`: a `transformers` GPT-2 on the standard library's source text, a
  tokenizer trained at start, a data loader with state, AdamW with warm-up and cosine, dropout on;
- `script:<repo>/examples/adopted/classifier.py`: a classifier loop written from docs/adopting.md alone, launched as a
  script from the site's entrypoint directory (the stack's `examples/`).

For each: a clean run (the same job, launched straight on the cluster) gives the reference fingerprint; a drilled run (weight flip, NaN and sick node for the
first, a NaN for the second; `make test` runs the second's NaN, `make test-drills` all four) is caught by the intended check naming the target node, drained, diagnosed, relaunched from the
picked checkpoint, and ends with the clean run's final weights bit for bit. That equality is the proof that
the loop's data-loader, scheduler and RNG state resume. Every node, reservation and job is restored after.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.clean_reference import CleanRun, launch_clean
from helpers.cleanup import restore_cluster
from helpers.marks import END_TO_END, only_in_test_drills
from longrun.drill import Rest, run_drill
from longrun.entrypoint import ENTRYPOINT_DIR_ENV
from longrun.monitor import lifecycle
from longrun.slurm.factory import make_client

from training.faults import sick_marker
from training.store.factory import store_from_env

pytestmark = END_TO_END
REPO = Path(__file__).resolve().parents[2]
STAMP = time.strftime("%H%M%S")
BASE = {
    "nodes": 3,
    "gpus_per_node": 0,
    "steps": 16,
    "checkpoint_every": 4,
    "recompute_every": 4,
    "vote_every": 4,
}
#: The GPT-2 example at the smallest size that still shows everything the test claims (a tokenizer trained
#: at start, a loader over real text, dropout, warm-up and cosine): 10 standard-library files (about 345
#: blocks of 128 tokens, over 100 per rank, more than 16 steps use), a 512-token vocabulary, 2 sequences
#: per rank and step. Its defaults (60 files, 2048 tokens, 8 sequences) cost about 10 s more CPU per launch
#: (a third more) for no more proof; the loop runs 7 times here.
HF_ARGS = ["--files", "10", "--vocab-size", "512", "--batch-size", "2"]
LOOPS: dict[str, dict[str, Any]] = {
    "hf": {"entrypoint": "module:training.examples.hf_gpt2", "entrypoint_args": HF_ARGS},
    # The stack's entrypoint directory is the repository's examples/ (longrun.stack.airflow).
    "adopted": {
        "entrypoint": f"script:{REPO / 'examples' / 'adopted' / 'classifier.py'}",
        "entrypoint_args": [],
    },
}
#: (loop, drill, the checks that may catch it first, the diagnosis's verdict). A flipped weight changes that
#: replica's next gradients: the audit at 12 may see it before the vote. A sick node stays sick for the
#: replay probe (diag-fail); a weight flip or a NaN leaves a healthy node (diag-pass).
CASES = [
    ("hf", {"kind": "weight-flip", "step": 9, "target": "n3"}, ("weight_vote", "recompute"), "pass"),
    ("hf", {"kind": "nan", "step": 6, "target": "n3"}, ("finite",), "pass"),
    ("hf", {"kind": "sick-node", "step": 9, "target": "n2"}, ("recompute",), "fail"),
    ("adopted", {"kind": "nan", "step": 7, "target": "n2"}, ("finite",), "pass"),
]
#: Left to `make test-drills`: every drill of the `transformers` example. Without Airflow, each of its drills
#: is caught by the intended check naming the node, and its clean run and its resume end on the same
#: weights bit for bit (tests/training/test_hf_example.py); the pick and the relaunch do not depend on the
#: loop; a user's loop through `training_run`, its pick and its resume are proven in `make test` by the
#: adopted loop's NaN below, and the `module:` entrypoint by every drill of the reference trainer
#: (tests/e2e/test_drill.py). The example's sick node with its clean reference cost about 345 busy
#: CPU-seconds of `make test` on two cores (the suite is CPU-bound there; README, "Tests").
ONLY_IN_TEST_DRILLS = {("hf", "weight-flip"), ("hf", "nan"), ("hf", "sick-node")}


def conf(loop: str, what: str, **more: Any) -> dict[str, Any]:
    return {**BASE, **LOOPS[loop], "run_name": f"ep{STAMP}-{loop}-{what}", **more}


_CLEAN: dict[str, CleanRun] = {}


def clean_run(slurm_conf: str, root: Path, loop: str) -> CleanRun:
    """The loop's clean run (once per session): the reference fingerprint. It is the job training_run
    would submit for the same Params, launched straight on the cluster (helpers.clean_reference): the
    drilled run below goes through Airflow, and a clean run through the DAG would add only its tasks.
    A false alarm in it fails the job (exit 93), and launch_clean then fails the test."""
    if loop not in _CLEAN:
        with pytest.MonkeyPatch.context() as mp:  # the site setting the stack gives its Airflow workers
            mp.setenv(ENTRYPOINT_DIR_ENV, str(REPO / "examples"))
            _CLEAN[loop] = launch_clean(slurm_conf, conf(loop, "clean"), root / loop)
        print(f"\nreference {loop}: job {_CLEAN[loop].job_id}, fingerprint {_CLEAN[loop].final_fingerprint}")
    return _CLEAN[loop]


@pytest.mark.parametrize(
    ("loop", "drill", "checks", "verdict"), CASES, ids=[f"{c[0]}-{c[1]['kind']}" for c in CASES]
)
def test_a_users_loop_is_guarded_end_to_end(
    rest: Rest,
    tmp_path_factory: pytest.TempPathFactory,
    loop: str,
    drill: dict[str, Any],
    checks: tuple[str, ...],
    verdict: str,
) -> None:
    if (loop, drill["kind"]) in ONLY_IN_TEST_DRILLS:
        only_in_test_drills(
            "the transformers example is proven without Airflow in tests/training/test_hf_example.py"
        )
    if loop == "hf":
        pytest.importorskip("transformers", reason="the hf extra is not installed")
    client = make_client(backend="cli", slurm_conf=os.environ["SLURM_CONF"])
    name = f"{drill['kind']}"
    marker = None
    if drill["kind"] == "sick-node":  # its marker is the simulated hardware fault: removed after the test
        state = lifecycle.fault_state_dir(lifecycle.spec_from_params(conf(loop, name)))
        marker = sick_marker(Path(state), drill["target"])
    try:
        clean = clean_run(
            os.environ["SLURM_CONF"], tmp_path_factory.getbasetemp() / "entrypoint-references", loop
        )
        drilled = run_drill(rest, store_from_env(), conf(loop, name, drill=drill))
        print("\n" + drilled.summary())
        inc = drilled.incident
        assert inc is not None and inc.status == "relaunched", drilled.summary()
        assert inc.alert["check"] in checks, inc.alert
        assert inc.attribution.node == drill["target"] and inc.alert["suspect_nodes"] == [drill["target"]]
        assert (inc.drain.reason or "").startswith(f"longrun:sdc:{conf(loop, name)['run_name']}:")
        assert inc.diagnosis.verdict == verdict, inc.diagnosis.summary
        assert drill["target"] not in (inc.relaunch.nodes or ())
        assert inc.checkpoint.step is not None and inc.checkpoint.step < drilled.detection_step
        assert drilled.final_step == BASE["steps"], drilled.summary()
        relaunch = drilled.segments[-1]
        assert (
            relaunch["start_step"] == inc.checkpoint.step
            and relaunch["first_step"] == inc.checkpoint.step + 1
        )
        assert drilled.final_fingerprint == clean.final_fingerprint, "final weights differ from the clean run"
    finally:
        if marker is not None:
            marker.unlink(missing_ok=True)
        restore_cluster(client)
