"""Which ranks hold the same weights: the replica layout the weight vote compares within.

Under plain DDP every rank holds the whole model, so every rank's weights must be equal. Under sharded data
parallelism (FSDP2 over one mesh dimension, HSDP over two) a rank holds one shard of each parameter, and only
the ranks along the *replicate* dimension hold the same shard; under tensor or pipeline parallelism beside
them, only the ranks with the same model-parallel coordinates do. A world-wide vote over such ranks finds no
majority (or a false one), so the vote groups ranks by the weights they hold:

    ReplicaLayout.ddp(world)                 one group: every rank
    ReplicaLayout.from_mesh(mesh)            one group per shard: the ranks that differ only along the
                                             data-parallel replicate dimension(s) ("replicate" by default)

`shard_of[r]` is rank r's group (the shard it holds, numbered in mesh order). The vote gathers one value
per rank over the whole world, as under DDP, and every rank computes the same per-group majorities from
that one gather, so the verdict is the same on every rank without a second collective.

A group of one rank has nothing to compare: a layout where every group has one rank (FSDP2 with no
replication) cannot carry a weight vote, and the vote refuses it (`votable`) rather than pass vacuously.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

REPLICATE = "replicate"


@dataclass(frozen=True, slots=True)
class ReplicaLayout:
    """Rank -> the group of ranks that hold the same weights (the shard it holds)."""

    shard_of: tuple[int, ...]
    """Group number of every rank, in rank order; groups are numbered 0..n-1."""

    def __post_init__(self) -> None:
        if not self.shard_of:
            raise ValueError("ReplicaLayout.shard_of is empty: a layout needs at least one rank")
        groups = sorted(set(self.shard_of))
        if groups != list(range(len(groups))):
            raise ValueError(f"ReplicaLayout.shard_of = {self.shard_of!r}: groups must be numbered 0..n-1")
        sizes = set(Counter(self.shard_of).values())
        if len(sizes) != 1:
            raise ValueError(
                f"ReplicaLayout.shard_of = {self.shard_of!r}: every shard must be held by equally many ranks"
            )

    @classmethod
    def ddp(cls, world_size: int) -> ReplicaLayout:
        """Every rank holds the whole model: one group."""
        return cls((0,) * world_size)

    @classmethod
    def from_ranks(
        cls, mesh_ranks: Sequence[Any], dim_names: Sequence[str], replicate: Sequence[str]
    ) -> ReplicaLayout:
        """From a mesh's global-rank array (nested lists, as `DeviceMesh.mesh.tolist()` gives it), its
        dimension names, and the names of the data-parallel dimensions whose ranks hold equal weights."""
        unknown = set(replicate) - set(dim_names)
        if unknown:
            raise ValueError(f"replicate dimension(s) {sorted(unknown)} not in the mesh's {list(dim_names)}")
        shape = _shape(mesh_ranks, len(dim_names))
        keep = [i for i, name in enumerate(dim_names) if name not in replicate]
        cells: dict[int, tuple[int, ...]] = {}
        for coord, rank in _cells(mesh_ranks, ()):
            cells[rank] = tuple(coord[i] for i in keep)
        world = len(cells)
        if sorted(cells) != list(range(world)) or world != _product(shape):
            raise ValueError(f"the mesh {mesh_ranks!r} does not hold each rank 0..{world - 1} exactly once")
        numbers: dict[tuple[int, ...], int] = {}
        for key in sorted(set(cells.values())):
            numbers[key] = len(numbers)
        return cls(tuple(numbers[cells[r]] for r in range(world)))

    @classmethod
    def from_mesh(cls, mesh: Any, replicate: Sequence[str] = (REPLICATE,)) -> ReplicaLayout:
        """From a torch `DeviceMesh` that spans the whole world: the ranks that differ only along the
        `replicate` dimension(s) hold the same shard. A 1-D mesh whose one dimension is replicate is DDP."""
        names = mesh.mesh_dim_names
        if not names:
            raise ValueError("the DeviceMesh has no dimension names: name them (mesh_dim_names=...)")
        return cls.from_ranks(mesh.mesh.tolist(), names, replicate)

    @property
    def world_size(self) -> int:
        return len(self.shard_of)

    @property
    def shards(self) -> int:
        """How many distinct groups (shards) there are."""
        return max(self.shard_of) + 1

    @property
    def replicas(self) -> int:
        """How many ranks hold each shard."""
        return self.world_size // self.shards

    @property
    def votable(self) -> bool:
        """At least two ranks hold each shard: a vote can see a difference. Three or more can name a rank."""
        return self.replicas >= 2

    def holders(self, shard: int) -> list[int]:
        """The global ranks that hold `shard`, in rank order."""
        return [r for r, s in enumerate(self.shard_of) if s == shard]

    def describe(self) -> str:
        return f"{self.shards} shard(s) x {self.replicas} replica(s) over {self.world_size} rank(s)"


def _shape(nested: Any, dims: int) -> tuple[int, ...]:
    shape = []
    level = nested
    for _ in range(dims):
        if not isinstance(level, list) or not level:
            raise ValueError(f"the mesh {nested!r} is not a {dims}-dimensional array of ranks")
        shape.append(len(level))
        level = level[0]
    return tuple(shape)


def _cells(nested: Any, coord: tuple[int, ...]) -> list[tuple[tuple[int, ...], int]]:
    if isinstance(nested, list):
        return [cell for i, sub in enumerate(nested) for cell in _cells(sub, (*coord, i))]
    if isinstance(nested, bool) or not isinstance(nested, int):
        raise ValueError(f"mesh entry {nested!r} is not a rank")
    return [(coord, nested)]


def _product(shape: tuple[int, ...]) -> int:
    out = 1
    for n in shape:
        out *= n
    return out
