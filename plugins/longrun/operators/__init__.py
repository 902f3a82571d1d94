"""Airflow operators of longrun (Slurm today; other helpers may add more)."""
