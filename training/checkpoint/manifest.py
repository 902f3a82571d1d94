"""Reading a checkpoint manifest: pure Python (no torch), so listing and promotion stay light.

The manifest (schema kind "manifest") is written last by `training.checkpoint.saver`; see docs/checkpoints.md.
"""

from __future__ import annotations

import json
from typing import Any

from training.records import schema

#: Files of a checkpoint directory: the payload, in the order written and uploaded, and the manifest.
MODEL_FILE = "model.pt"
OPTIM_FILE = "optim.pt"
EXTRA_FILE = "extra.pt"
MANIFEST_FILE = "manifest.json"

#: A sharded checkpoint's manifest says `format: SHARDED_FORMAT` (training.checkpoint.sharded); its files
#: include DCP's `.metadata`, the one file name starting with a dot that a manifest may list.
SHARDED_FORMAT = "dcp-v1"
DCP_METADATA = ".metadata"


class CheckpointError(Exception):
    """A checkpoint cannot be read: missing manifest, missing file, hash mismatch, bad payload."""


def read_manifest(data: bytes, where: str) -> dict[str, Any]:
    """Parse and check a manifest; CheckpointError names `where` and what is wrong."""
    try:
        manifest = json.loads(data)
        schema.validate("manifest", manifest)
    except (ValueError, schema.SchemaError) as e:
        raise CheckpointError(f"manifest {where} is unreadable: {e}") from None
    if manifest.get("kind") != "manifest":
        raise CheckpointError(f"manifest {where} has kind {manifest.get('kind')!r}, expected 'manifest'")
    dotted = {DCP_METADATA} if manifest.get("format") == SHARDED_FORMAT else set()
    for i, f in enumerate(manifest["files"]):
        if not (
            isinstance(f, dict)
            and isinstance(f.get("name"), str)
            and f["name"]
            and "/" not in f["name"]
            and (not f["name"].startswith(".") or f["name"] in dotted)
            and isinstance(f.get("size"), int)
            and isinstance(f.get("sha256"), str)
        ):
            raise CheckpointError(f"manifest {where}: files[{i}] = {f!r:.120} is not a file entry")
    return manifest
