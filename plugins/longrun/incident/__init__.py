"""The SDC incident: from an alert record to a drained, diagnosed node and a relaunch.

The steps of `sdc_incident` as plain functions over a store and a Slurm client, callable without Airflow
(the task bodies are longrun.tasks.sdc_incident; the node's health checks they use, longrun.health):

    runner          how every step runs: load the record, skip what is done, observe, act, record
    record          the incident record under the run's incidents/, written idempotently, keyed by alert
    events, modes   the timeline's event names; act / approve / observe: what each step may change
    steps           open, freeze, attribute, pick; step_drain, step_diagnose, step_relaunch the others
    attribution     evidence -> one suspect node, or "ambiguous" (suspect software: drain nothing)
    reference_source, keep_drained   the diagnosis's probe reference; what longrun drained stays drained
    relaunch_plan   the relaunch's RunSpec
    hot_spare       with spares: the job is kept, the node diagnosed and released inside it, the run
                    directed onto a spare
    exclusive       one incident per run acts at a time
    approval        what an approval shows, and who may lift the drain rate limit
    recovery, closing   the time to recover, measured once the relaunch trains; closing the incident
"""
