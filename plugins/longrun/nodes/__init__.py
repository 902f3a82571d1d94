"""The node's story: history records per node, the repeat-offender policy, and the return to service."""
