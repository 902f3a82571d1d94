"""The operator's view of a run: the run-health pages (a FastAPI app the Airflow plugin mounts) and the
plots, which also go into incident records (`render_incident_plots`).

    model   what the page shows, as plain values
    data    reads one run's records from the store into that model
    plots   PNG plots (matplotlib, Agg) and `render_incident_plots`
    page    the HTML
    app     the FastAPI app
"""
