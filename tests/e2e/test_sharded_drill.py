"""Sharded runs (HSDP: 3 replica groups x 2 shards, 6 ranks on 3 nodes, 2 ranks per node) through Airflow, end
to end on the local stack. Each drill on node n3 is caught by the intended check, which names n3; the incident
drains n3, diagnoses it, relaunches the run on n1, n2 and the spare n4 from the picked sharded checkpoint
(written in the background with `dcp.async_save`, fetched from the store, checked whole, loaded onto the
same mesh), and the run ends on the clean run's weights:
every rank's shards, bit for bit (the report's fingerprint is taken over all of them, `<rank>/<tensor>`).

- `sick-node` (every matmul on n3 slightly wrong from step 13): the recompute by replica groups (loss and
  local gradient, every rank at once) at step 15 names n3 (a vote never would: every replica applies the same wrong average); its diagnosis fails.
  Always run.
- `weight-flip` (one bit of one shard of n3's replica) and `scale` (n3's first rank's gradient shard after
  the reduction): the recompute or the vote at step 15, naming n3; the diagnosis passes. Run with
  `make test-drills` (LONGRUN_ALL_DRILLS=1): each drill is some five minutes here, and CI's budget
  keeps one.

FSDP2 (`parallelism: fsdp`, the 6 ranks one shard group, nothing replicated, no vote): the sick-node drill,
caught by the recompute naming n3, relaunched from the picked checkpoint, bit-identical; with
`make test-drills`.

The clean reference is the same Params without the drill, launched straight on the cluster
(helpers.clean_reference). Not covered here (docs/sharding.md): hot spares with a sharded job.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from helpers.clean_reference import CleanRun, launch_clean
from helpers.marks import END_TO_END, only_in_test_drills
from longrun.drill import return_to_service, run_drill
from longrun.slurm.factory import make_client

from training.records import schema
from training.store.factory import store_from_env

pytestmark = END_TO_END

HSDP_CONF = {
    "nodes": 3,
    "gpus_per_node": 0,
    "ranks_per_node": 2,
    "parallelism": "hsdp",
    "steps": 30,
    "checkpoint_every": 10,
    "recompute_every": 5,
    "vote_every": 5,
}
DRILLS = {
    # kind: (checks that may catch it first, diagnostic verdict)
    "sick-node": (("recompute",), "fail"),
    "weight-flip": (("recompute", "weight_vote"), "pass"),
    "scale": (("recompute", "weight_vote"), "pass"),
}
ALWAYS = ("sick-node",)
FSDP_CONF = {**HSDP_CONF, "parallelism": "fsdp"}
STAMP = time.strftime("%H%M%S")


@pytest.fixture(scope="module")
def hsdp_reference(env, tmp_path_factory: pytest.TempPathFactory) -> CleanRun:
    root = tmp_path_factory.mktemp("hsdp-reference")
    return launch_clean(env.env["SLURM_CONF"], {**HSDP_CONF, "run_name": f"hsdp{STAMP}-clean"}, root)


def all_drills() -> None:
    only_in_test_drills("`make test` runs the HSDP sick-node drill")


def drilled(rest, conf: dict, run: str, kind: str, reference: CleanRun) -> None:
    """Run the `kind` drill on n3 through Airflow and check what every sharded drill must show (module
    docstring); returns nodes to service afterwards."""
    checks, verdict = DRILLS[kind]
    client = make_client(backend="cli", slurm_conf=os.environ["SLURM_CONF"])
    return_to_service(client)  # a previous test's node, as the runbook's return-to-service would
    store = store_from_env()
    try:
        drill = {"kind": kind, "step": 13, "target": "n3"}
        result = run_drill(rest, store, {**conf, "run_name": run, "drill": drill})
        print("\n" + result.summary())
        inc = result.incident
        assert inc is not None and inc.status == "relaunched", result.summary()
        assert inc.alert["check"] in checks, inc.alert
        assert inc.alert["suspect_nodes"] == ["n3"] and inc.attribution.node == "n3", inc.alert
        assert inc.diagnosis.verdict == verdict, inc.diagnosis.summary
        nodes = inc.relaunch.nodes or ()
        assert "n3" not in nodes and len(nodes) == 3 and "n4" in nodes, inc.relaunch
        pick = inc.checkpoint.step
        assert pick is not None and 0 < pick < (result.detection_step or 0), inc.checkpoint
        assert result.final_step == conf["steps"], result.summary()
        assert result.final_fingerprint == reference.final_fingerprint, (
            "some shard differs from the clean run"
        )
        # The relaunch resumed from the pick (the records), and its checkpoints are sharded ones, validated.
        relaunch = result.segments[-1]
        assert relaunch["start_step"] == pick and relaunch["first_step"] == pick + 1, relaunch
        assert relaunch["resumed_from"].rstrip("/").endswith(f"step-{pick:08d}"), relaunch
        assert result.promoted_steps[-1] == conf["steps"], result.promoted_steps
        final = json.loads(store.get_bytes(schema.store_key(run, schema.manifest_path(conf["steps"]))))
        assert final["format"] == "dcp-v1" and set(final["shard_fingerprints"]) == {str(r) for r in range(6)}
        key = schema.store_key(run, schema.checkpoint_dir(conf["steps"]))
        names = {o.key.rsplit("/", 1)[-1] for o in store.list(key)}
        assert {".metadata", "sharded-manifest.json"} | {f"__{r}_0.distcp" for r in range(6)} <= names, names
    finally:
        return_to_service(client)


@pytest.mark.parametrize("kind", list(DRILLS))
def test_hsdp_drill_is_caught_naming_the_node_and_the_relaunch_ends_bit_identical(rest, hsdp_reference, kind):
    if kind not in ALWAYS:
        all_drills()
    drilled(rest, HSDP_CONF, f"hsdp{STAMP}-{kind}", kind, hsdp_reference)


def test_fsdp2_sick_node_is_caught_by_the_recompute_and_the_relaunch_ends_bit_identical(rest, env, tmp_path):
    all_drills()
    reference = launch_clean(env.env["SLURM_CONF"], {**FSDP_CONF, "run_name": f"fsdp{STAMP}-clean"}, tmp_path)
    drilled(rest, FSDP_CONF, f"fsdp{STAMP}-sick-node", "sick-node", reference)
