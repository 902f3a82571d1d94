"""The SDC incident: from an alert record to a drained, diagnosed node and a relaunch.

One module per job, all callable without Airflow (the DAG `sdc_incident` is a thin shell over them):

    attribution   evidence -> one suspect node, or "ambiguous" (suspect software: drain nothing)
    ratelimit     drains per window and per incident, as a ledger in the store (conditional writes)
    dcgm          `dcgmi diag -r <level>`: the level from the evidence, its JSON parsed into a verdict
    diagnose      the replay probe (+ DCGM where present) on the drained node, through a MAINT reservation
    record        the incident record under the run's incidents/, written idempotently, keyed by alert
    modes         act / approve / observe: what each step may change
"""
