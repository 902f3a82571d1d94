"""longrun's in-job package: the SDC checks, fingerprints, fault injection, checkpoint saving, the trainer.

It never imports Airflow. `training.records.schema` and `training.store` import neither torch nor Airflow, so the
Airflow side can use them without pulling in the training stack.
"""
