"""The writer of the checkpoint saver: a queued snapshot becomes payload files in the run dir.

Runs in the saver's writer thread. Each part is written to a temporary file, fsynced and renamed, so a
crash leaves either the old file or the new one. A manifest of the same step from an earlier save is
removed first: it would vouch for files about to change. The manifest itself is the upload stage's
(`training.checkpoint.upload`), written last.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from training.checkpoint.manifest import EXTRA_FILE, MANIFEST_FILE, MODEL_FILE, OPTIM_FILE
from training.checkpoint.snapshot_queue import PendingSave
from training.fingerprint.host import combine, fingerprint_state

#: The payload files of a checkpoint, in the order they are written.
PAYLOAD = (MODEL_FILE, OPTIM_FILE, EXTRA_FILE)


def write_payload(ckpt_dir: Path, item: PendingSave) -> None:
    """Write the snapshot's files under `ckpt_dir`; fill in the weight fingerprints the caller did not
    give. Raises OSError (or torch's errors) for the saver to report."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    (ckpt_dir / MANIFEST_FILE).unlink(missing_ok=True)
    for name, obj in zip(PAYLOAD, (item.model_state, item.optim_state, item.extra), strict=True):
        tmp = ckpt_dir / f".tmp-{name}"
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, ckpt_dir / name)
    if "fingerprints" not in item.manifest_fields:
        fps = fingerprint_state(item.model_state)
        item.manifest_fields["fingerprints"] = fps
        item.manifest_fields.setdefault("fingerprint", combine(fps))
