"""The checkpoint saver's settings and the outcome of one save: plain values, checked on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Manifest fields the caller supplies (through `manifest_fields`), with the value used when absent.
CALLER_FIELDS: dict[str, Any] = {
    "weight_vote": {},
    "coverage": {},
    "loss": None,
    "code_version": "unknown",
    "world": {},
}

WRITERS = ("auto", "nvrx", "thread")


@dataclass(frozen=True, slots=True, kw_only=True)
class SaverSettings:
    """How a `CheckpointSaver` writes and uploads."""

    writer: str = "auto"
    """`nvrx`: upload in NVRx's persistent async worker process; `thread`: in the saver's writer thread;
    `auto`: nvrx when it imports and the store can be rebuilt in another process, else thread."""
    retry_deadline_s: float = 120.0
    """How long one upload keeps retrying a store that is unavailable before the save is reported failed."""
    max_pending: int = 2
    """Saves in flight at most; a further save() waits for the oldest (bounded memory for snapshots)."""
    wait_timeout_s: float = 1800.0
    """Upper bound for wait(), close() and a save() blocked by `max_pending`."""
    poll_s: float = 0.05
    """How often the writer thread looks at the upload worker."""
    background_nice: int = 10
    """Niceness added to the writer thread and the upload worker, so that on a host short of cores the
    training step gets the CPU first (0: same priority as training)."""
    reuse_buffers: bool = True
    """Keep one snapshot's worth of CPU buffers between saves and copy into them (fewer page faults in
    the step's snapshot copy; costs that much host memory for the whole run)."""

    def __post_init__(self) -> None:
        if self.writer not in WRITERS:
            raise ValueError(f"SaverSettings.writer = {self.writer!r}; expected one of {WRITERS}")
        for name in ("retry_deadline_s", "wait_timeout_s", "poll_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"SaverSettings.{name} = {value!r}; expected a positive number of seconds")
        if not isinstance(self.background_nice, int) or not 0 <= self.background_nice <= 19:
            raise ValueError(
                f"SaverSettings.background_nice = {self.background_nice!r}; expected an int in 0..19"
            )
        if not isinstance(self.max_pending, int) or self.max_pending < 1:
            raise ValueError(f"SaverSettings.max_pending = {self.max_pending!r}; expected an int >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class SaveResult:
    """The outcome of one background save."""

    step: int
    """Training step of the checkpoint."""
    ok: bool
    """True when the files and the manifest are in the run dir and (with a store) in the store."""
    error: str | None
    """What failed, naming the file or the store; None when ok."""
    uploaded: bool
    """True when the manifest reached the store (False without a store)."""
    duration_s: float
    """Seconds from save() to the end of the upload stage."""
    nbytes: int
    """Payload bytes written."""
    writer: str
    """`nvrx` or `thread`: where the upload stage ran."""
