"""Checkpoints on the orchestrator side: list, validate, promote/demote, the pre-incident pick, retention.

One module per job, all plain functions over an `ObjectStore` (no Airflow), shared by the DAG tasks and
the CLI `longrun checkpoints ...`:

    catalog     read what the store holds: manifests (a bad one is reported and ignored), validation,
                promotion, suspect and check records
    validate    every file present and hashed right, loads (weights only), finite, fingerprints match
    promote     the promoted pointer by conditional write, its history; demotion (suspect marks)
    pick        the newest promoted checkpoint from before the fault, and why
    retention   keep the last K promoted and what open incidents may need; delete the rest
    cli         `longrun checkpoints list|validate|promote|pick|retention`
"""
