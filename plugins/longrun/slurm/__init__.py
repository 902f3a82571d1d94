"""longrun's access to Slurm: a typed job spec, one pure sbatch renderer, one client interface with a CLI
and a pyslurm backend, and one table that maps final job states to outcomes.

No Airflow here: the hooks, operators, sensors and triggers in the sibling packages wrap this layer.
"""
