"""Recovery inside the allocation, for jobs that hold spare nodes: the batch script's supervisor
(`supervisor`), the warm standby of the next attempt (`standby`), and the orchestrator's relaunch directive
they follow (`directive`)."""
