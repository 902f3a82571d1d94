"""Where the guard sees this rank's local gradient on a sharded model, before FSDP2 reduces it.

DDP shows the local gradient to a communication hook (training.api.gradients). FSDP2 has no such hook, but
it lets a caller replace the reduce-scatter it runs after each FSDP unit's backward
(`FSDPModule.set_custom_reduce_scatter`, public since torch 2.8). The collective's input is this rank's
whole local gradient of the unit's parameters, not yet reduced: FSDP lays each parameter's gradient out in
one chunk per shard rank (zero-padded to equal chunks) and divides it by its pre-divide factor first, the
same way on every rank. `ReduceScatterTap` is that collective: at an audit step it fingerprints the input,
then runs the reduce-scatter FSDP would have run (`dist.reduce_scatter_tensor`, same output, group and op),
so what FSDP does with the result is unchanged. The fingerprints of one backward, in the order FSDP reduces
its units (the reverse of the forward, the same on every rank with the same model), combine into one value:
the local gradient's fingerprint that the recompute check compares, as under DDP.

Why the whole input and not each parameter's gradient: every rank of a shard group lays the gradient out
identically, so one fingerprint per unit is as exact and costs one pass over the buffer.

The tap is not installed (`install` returns None, and the recompute compares the loss only) when FSDP would
not call it (a shard dimension of one rank: nothing to scatter), when the torch in use has no
`set_custom_reduce_scatter`, or when a module has several parameter groups (FSDP refuses a custom collective
there). It replaces a custom reduce-scatter the caller set before `prepare_sharded`; a user who needs their
own (symmetric memory, say) cannot have both yet.

At audit steps the buffers are allocated with zeros rather than left uninitialised: FSDP's copy-in writes
every element, padding included, today, but a padding byte left to chance would turn into a false alarm
between two healthy ranks. Other steps allocate as FSDP does (no memset over the gradient every step).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from training.fingerprint.device import fingerprint_where_it_lives
from training.fingerprint.host import fingerprint_sequence

log = logging.getLogger("training.api")


class ReduceScatterTap:
    """FSDP2's reduce-scatter with a look at its input: `arm()` before a backward whose local gradient is
    wanted, `fingerprint()` after it. Unarmed it only forwards the collective (every step but audits)."""

    def __init__(self) -> None:
        self._armed = False
        self._seen: list[int] = []

    def arm(self) -> None:
        """Collect the fingerprints of the next backward (forgetting any collected before)."""
        self._armed, self._seen = True, []

    def disarm(self) -> None:
        self._armed, self._seen = False, []

    def fingerprint(self) -> int:
        """The local gradient's fingerprint of the backward since `arm()`: one value over the units'
        reduce-scatter inputs in the order FSDP reduced them. RuntimeError if FSDP reduced nothing (a
        backward that reached no sharded parameter)."""
        if not self._seen:
            raise RuntimeError(
                "FSDP ran no reduce-scatter since the tap was armed: the backward reached no sharded parameter"
            )
        return fingerprint_sequence(self._seen)

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if self._armed:  # the buffers a fingerprint may read: every byte defined (module docstring)
            return torch.zeros(*size, dtype=dtype, device=device)
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        if self._armed:
            self._seen.append(fingerprint_where_it_lives(input_tensor))
        return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)


def shard_group_size(mesh: Any) -> int:
    """How many ranks share out one copy of the model: the mesh's "shard" dimension."""
    names = tuple(mesh.mesh_dim_names or ())
    return int(mesh.size()) if names == ("shard",) else int(mesh["shard"].size())


def install(module: nn.Module, mesh: Any) -> ReduceScatterTap | None:
    """One tap as the reduce-scatter of every FSDP2 module in `module`; None (with the reason in the log)
    where it cannot see the local gradient: see the module docstring."""
    from torch.distributed.fsdp import FSDPModule

    if shard_group_size(mesh) < 2:
        log.warning(
            "a shard dimension of one rank has no reduce-scatter: the recompute compares the loss only"
        )
        return None
    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not all(hasattr(m, "set_custom_reduce_scatter") for m in units):
        log.warning(
            "torch %s has no FSDPModule.set_custom_reduce_scatter: the recompute compares the loss only",
            torch.__version__,
        )
        return None
    tap = ReduceScatterTap()
    try:
        for m in units:
            # FSDP only calls `allocate` and the object itself; its `ReduceScatter` base class lives in a
            # private module, which longrun does not import.
            m.set_custom_reduce_scatter(cast(Any, tap))
    except ValueError as e:  # several parameter groups in one module
        log.warning("FSDP refused a custom reduce-scatter (%s): the recompute compares the loss only", e)
        return None
    return tap
