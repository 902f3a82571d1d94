"""A node's health, as both `sdc_incident` and `node_return` judge it (plain functions, no Airflow):

    dcgm             `dcgmi diag -r <level>`: the level from the evidence, its JSON parsed into a verdict
    node_check       the replay probe (+ DCGM where present), run on the node itself
                     (`python -m longrun.health.node_check`)
    diagnose         longrun's drain reasons, and node_check on a drained node through a MAINT reservation
    probe_reference  the probe's known-good result: computed on a healthy node, cached per partition, and
                     the rule by which a probe run confirms it
    ratelimit        drains per window and per incident, as a ledger in the store (conditional writes)
    history          the node's history records; `policy`, the repeat-offender rule read from it
    cli              `longrun nodes list|show`

Nothing here imports `longrun.incident` or `longrun.nodes`: those use it.
"""
