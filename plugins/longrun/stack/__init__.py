"""The local stack: munge + Slurm (n1..n4), SeaweedFS S3 and Airflow on 127.0.0.1 under one state dir.

`longrun stack up|down|status|env` is the command; `Stack` is the Python API behind it.
"""
