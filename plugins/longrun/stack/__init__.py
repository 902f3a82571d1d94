"""The local stack: munge + Slurm (n1..n4), SeaweedFS S3 and Airflow on 127.0.0.1 under one state dir.

`longrun stack up|down|status|env` is the command; `Stack` is the Python API behind it.
"""

from .layout import COMPONENTS, NODES, PARTITION, Layout, default_state_dir
from .procs import StackError
from .stack import Stack

__all__ = ["COMPONENTS", "NODES", "PARTITION", "Layout", "Stack", "StackError", "default_state_dir"]
