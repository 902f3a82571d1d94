"""A sharded run (HSDP: 3 replica groups x 2 shards, 6 ranks on 3 nodes, 2 ranks per node) through Airflow,
end to end on the local stack: a weight-flip drill on one shard of one replica (node n3's lowest rank) is
caught by the weight vote within the shard's replicas, which names n3; the incident drains n3, relaunches
the run on n1, n2 and the spare n4 from the picked sharded checkpoint (fetched from the store, checked whole,
loaded onto the same mesh), and the run ends on the clean run's weights: every rank's shards, bit for bit
(the report's fingerprint is taken over all of them, `<rank>/<tensor>`).

The clean reference is the same Params without the drill, launched straight on the cluster
(helpers.clean_reference). What this does not cover yet (docs/sharding.md): the recompute by replica groups
(a sick node's wrong gradients are averaged into every replica's, so under HSDP only the recompute could see
them: the sick-node drill is not caught without it), hot spares with a sharded job, FSDP2 through Airflow.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from helpers.clean_reference import CleanRun, launch_clean
from helpers.marks import END_TO_END
from longrun.drill import Rest, prepare, return_to_service, run_drill
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
    "recompute_every": 0,
    "vote_every": 5,
}
DRILL = {"kind": "weight-flip", "step": 13, "target": "n3"}
STAMP = time.strftime("%H%M%S")


@pytest.fixture(scope="module")
def env(airflow_stack):
    mp = pytest.MonkeyPatch()
    for k, v in airflow_stack.env.items():
        mp.setenv(k, v)
    yield airflow_stack
    mp.undo()


@pytest.fixture(scope="module")
def rest(env):
    r = Rest.login(env.url, env.user, env.password)
    prepare(r)
    return r


@pytest.fixture(scope="module")
def hsdp_reference(env, tmp_path_factory: pytest.TempPathFactory) -> CleanRun:
    root = tmp_path_factory.mktemp("hsdp-reference")
    return launch_clean(env.env["SLURM_CONF"], {**HSDP_CONF, "run_name": f"hsdp{STAMP}-clean"}, root)


def test_hsdp_weight_flip_is_caught_naming_the_node_and_the_relaunch_ends_bit_identical(rest, hsdp_reference):
    client = make_client(backend="cli", slurm_conf=os.environ["SLURM_CONF"])
    return_to_service(client)  # a previous test's node, as the runbook's return-to-service would
    run = f"hsdp{STAMP}-flip"
    store = store_from_env()
    try:
        result = run_drill(rest, store, {**HSDP_CONF, "run_name": run, "drill": DRILL})
        print("\n" + result.summary())
        inc = result.incident
        assert inc is not None and inc.status == "relaunched", result.summary()
        assert inc.alert["check"] == "weight_vote", inc.alert
        assert inc.alert["suspect_nodes"] == ["n3"] and inc.attribution.node == "n3", inc.alert
        nodes = inc.relaunch.nodes or ()
        assert "n3" not in nodes and len(nodes) == 3 and "n4" in nodes, inc.relaunch
        pick = inc.checkpoint.step
        assert pick is not None and pick < (result.detection_step or 0), inc.checkpoint
        assert result.final_step == HSDP_CONF["steps"], result.summary()
        assert result.final_fingerprint == hsdp_reference.final_fingerprint, (
            "some shard differs from the clean run"
        )
        # The relaunch resumed from the pick (the records), and its checkpoints are sharded ones, validated.
        relaunch = result.segments[-1]
        assert relaunch["start_step"] == pick and relaunch["first_step"] == pick + 1, relaunch
        assert result.promoted_steps[-1] == HSDP_CONF["steps"], result.promoted_steps
        final = json.loads(store.get_bytes(schema.store_key(run, schema.manifest_path(HSDP_CONF["steps"]))))
        assert final["format"] == "dcp-v1" and set(final["shard_fingerprints"]) == {str(r) for r in range(6)}
        key = schema.store_key(run, schema.checkpoint_dir(HSDP_CONF["steps"]))
        names = {o.key.rsplit("/", 1)[-1] for o in store.list(key)}
        assert {".metadata", "sharded-manifest.json"} | {f"__{r}_0.distcp" for r in range(6)} <= names, names
    finally:
        return_to_service(client)
