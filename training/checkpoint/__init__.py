"""Checkpoint saves and loads: CPU snapshots (`snapshot`) queued for a background writer (`snapshot_queue`,
`writer`), uploaded with a manifest written last (`upload`, `uploaders`), coordinated by `saver`, read back and
verified by `load`; `manifest` reads manifests without torch, `settings` holds the saver's checked settings."""
