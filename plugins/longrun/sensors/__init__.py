"""Airflow sensors of longrun (Slurm today; other helpers may add more)."""
