"""The Airflow task bodies of the DAGs, one module per DAG: Params and the Airflow context in, the steps
of the layers below called, plain dicts out.

    training_run      preflight, the job's fields, the finish
    sdc_incident      open, freeze, attribute, drain, diagnose, pick, relaunch, summary
    node_return       select, probe, resume, summary (and the node policy Variable)
    node_history      what sdc_incident's steps tell the node history
    checkpoint_audit  close the healthy incidents, then audit

Only this layer raises Airflow's task exceptions (AirflowFailException, AirflowSkipException), joins an
incident to the node history, and draws plots; the DAG files import these bodies inside their tasks.
"""
