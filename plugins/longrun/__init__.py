"""longrun, the Airflow side: Slurm access, checkpoint store logic, incident logic, the Airflow plugin.

Importing this package must stay cheap: it imports neither Airflow nor torch. Submodules that need them
import them themselves.
"""
