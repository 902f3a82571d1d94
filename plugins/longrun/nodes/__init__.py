"""The steps of `node_return` (`returning`: select, probe, resume; `outcome`: what they hand on), plain
functions over a store and a Slurm client. The node's history and health checks they use are in
`longrun.health`; the task bodies in `longrun.tasks.node_return`."""
