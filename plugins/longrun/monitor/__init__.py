"""Deferrable monitoring and the lifecycle of a training run: `watch` (one look, pure), `trigger` (the
triggerer side), `operator` (validates and promotes checkpoints, hands alerts to sdc_incident), `gate`
(the checkpoint gate), `lifecycle` (preflight, the job spec, the finish), `segments` (the trainer's
segment and fault records), `handover` (the operators that trigger the next DAG). Nothing here imports
`longrun.incident`: the incident builds on the run, not the other way round."""
