"""Deferrable monitoring of a training run: `watch` (one look, pure), `trigger` (the triggerer side),
`operator` (validates and promotes checkpoints, hands alerts to sdc_incident)."""
