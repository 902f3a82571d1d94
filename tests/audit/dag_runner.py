"""Run DAG `checkpoint_audit` twice with `dag.test()` in this process (a subprocess of the test): over a
healthy local store, then after flipping a byte in a stored object. Prints `STATE <n> <state>`.

Usage: python dag_runner.py DAGS_FOLDER STORE_DIR (AIRFLOW_HOME set to a migrated home)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from airflow.dag_processing.dagbag import DagBag

from training.records import schema
from training.store.local import LocalDirStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from audit.builders import healthy_run  # noqa: E402

dags_folder, store_dir = sys.argv[1], sys.argv[2]
os.environ["LONGRUN_STORE_DIR"] = store_dir
store = LocalDirStore(store_dir)
healthy_run(store, "alpha")
dag = DagBag(dag_folder=os.path.join(dags_folder, "checkpoint_audit.py")).dags["checkpoint_audit"]
print("STATE 1", dag.test(run_conf={"sample_size": 100}).state, flush=True)
path = Path(store_dir) / schema.store_key("alpha", schema.checkpoint_dir(20) + "model.pt")
data = bytearray(path.read_bytes())
data[5] ^= 0x10
path.write_bytes(bytes(data))
print("STATE 2", dag.test(run_conf={"sample_size": 100}).state, flush=True)
