"""Fault injection for drills and tests: never on by default, loud in the log when on.

A fault is `KIND:STEP:TARGET` (CLI `--fault`, repeatable; or LONGRUN_FAULTS, comma-separated):

    nan, inf     one element of one local gradient becomes NaN / +Inf at STEP on rank TARGET
    scale        one local gradient element times 10 at STEP on rank TARGET (finite and plausible)
    weight-flip  one bit of one weight of rank TARGET's replica flips after the update of STEP
    sick-node    from STEP on, the output of every matmul layer of the model (`nn.Linear`, convolutions,
                 `transformers`' `Conv1D`) on node TARGET (a node name, or a rank whose node is meant) is multiplied by (1 + 1e-3), persistently: a marker file
                 <LONGRUN_FAULT_STATE_DIR>/sick-nodes/<node> makes later processes on that node (the
                 replay probe, a relaunch) sick too
    crash        rank TARGET SIGKILLs itself at the start of STEP
    hang         rank TARGET sleeps at the start of STEP (bounded by LONGRUN_HANG_S, default 3600 s)

TARGET is a rank number or a node name. For every kind but sick-node a node name means the lowest rank
placed on that node: the rendezvous decides which rank lands where, so a drill that must hit one node
names the node.

The drills work on any model the guard (training.api) is given, through hooks only: forward hooks on the
model's matmul layers (sick-node), the DDP communication hook on the local gradient (nan, inf,
scale: training.api.gradients), the parameters after the optimizer step (weight-flip).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.records.schema import FAULT_KINDS, NODE_NAME

log = logging.getLogger("training.faults")

#: Relative perturbation of every matmul result on a sick node: small enough to look plausible.
SICK_EPS = 1e-3
SCALE_FACTOR = 10.0
#: The bit flipped by `weight-flip`: the top mantissa bit of a float32 (a finite, plausible change).
FLIP_BIT = 22


class FaultSpecError(ValueError):
    """A fault spec that cannot be parsed; the message shows the spec and the expected form."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """One injected fault."""

    kind: str
    """One of schema.FAULT_KINDS."""
    step: int
    """The step (>= 1) at which it fires (from which on, for sick-node)."""
    rank: int | None = None
    """Target rank."""
    node: str | None = None
    """Target node name: sick-node perturbs every rank on it; any other kind fires on the node's lowest rank,
    so a drill can name the node it means whatever rank the rendezvous placed there."""

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise FaultSpecError(f"fault kind {self.kind!r} is unknown; known: {', '.join(FAULT_KINDS)}")
        if self.step < 1:
            raise FaultSpecError(f"fault step must be >= 1, got {self.step}")
        if (self.rank is None) == (self.node is None):
            raise FaultSpecError(f"fault {self.kind} needs exactly one target, a rank or a node name")
        if self.node is not None and not NODE_NAME.match(self.node):
            raise FaultSpecError(
                f"fault {self.kind}: target {self.node!r} is neither a rank number nor a node name"
            )
        if self.rank is not None and self.rank < 0:
            raise FaultSpecError(f"fault {self.kind}: rank {self.rank} is negative")

    def spec(self) -> str:
        return f"{self.kind}:{self.step}:{self.node if self.node is not None else self.rank}"


def parse_fault(spec: str) -> Fault:
    """Parse `KIND:STEP:TARGET`."""
    parts = spec.strip().split(":")
    if len(parts) != 3 or not all(parts):
        raise FaultSpecError(f"fault {spec!r} is not KIND:STEP:TARGET (e.g. nan:5:1 or sick-node:5:n2)")
    kind, step_s, target = parts
    try:
        step = int(step_s)
    except ValueError:
        raise FaultSpecError(f"fault {spec!r}: STEP {step_s!r} is not an integer") from None
    if target.isdigit():
        return Fault(kind=kind, step=step, rank=int(target))
    return Fault(kind=kind, step=step, node=target)


def faults_from(specs: Iterable[str], env: dict[str, str] | None = None) -> tuple[Fault, ...]:
    """CLI specs plus LONGRUN_FAULTS (comma-separated)."""
    env = dict(os.environ if env is None else env)
    all_specs = list(specs) + [s for s in env.get("LONGRUN_FAULTS", "").split(",") if s.strip()]
    return tuple(parse_fault(s) for s in all_specs)


def fault_state_dir(default: Path) -> Path:
    return Path(os.environ.get("LONGRUN_FAULT_STATE_DIR") or default)


def sick_marker(state_dir: Path, node: str) -> Path:
    return state_dir / "sick-nodes" / node


def node_is_sick(state_dir: Path, node: str) -> bool:
    return sick_marker(state_dir, node).exists()


def is_matmul_layer(module: nn.Module) -> bool:
    """The layers a sick node's wrong matmuls reach: `nn.Linear`, convolutions, and layers that are a
    linear map by another name (`transformers`' GPT-2 `Conv1D`, which is a Linear with its weight
    transposed)."""
    return isinstance(module, nn.Linear | nn.modules.conv._ConvNd) or type(module).__name__ == "Conv1D"


def perturb_linear_outputs(model: nn.Module, is_on: Callable[[], bool]) -> list[Any]:
    """Forward hooks on every matmul layer of `model` (`is_matmul_layer`) that multiply its output by
    (1 + SICK_EPS) while `is_on()`: a node that computes slightly wrong. Returns the hook handles
    (`.remove()` them to undo)."""
    factor = 1.0 + SICK_EPS

    def hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor | None:
        return output * factor if is_on() else None

    return [m.register_forward_hook(hook) for m in model.modules() if is_matmul_layer(m)]


class Injector:
    """Applies the faults that target this process at the right moments of the step."""

    def __init__(
        self,
        faults: tuple[Fault, ...],
        *,
        rank: int,
        node: str,
        nodes: list[str],
        state_dir: Path,
        on_fire: Callable[[Fault, int], None] | None = None,
    ):
        self.rank, self.node, self.state_dir = rank, node, state_dir
        # Called with (fault, step) right before a fault is injected: the drill's proof that it fired.
        self.on_fire = on_fire
        self.faults = faults
        self.mine = [f for f in faults if self._targets_me(f, nodes)]
        # A node made sick by an earlier process stays sick (the marker is the simulated hardware).
        self.sick = node_is_sick(state_dir, node)
        if self.sick:
            log.warning("FAULT sick-node: marker %s is present: every matmul on %s is perturbed",
                        sick_marker(state_dir, node), node)  # fmt: skip
        if faults:
            log.warning(
                "FAULT INJECTION IS ON: %s (rank %d on %s is targeted by: %s)",
                ", ".join(f.spec() for f in faults),
                rank,
                node,
                ", ".join(f.spec() for f in self.mine) or "none",
            )

    def _targets_me(self, f: Fault, nodes: list[str]) -> bool:
        """`nodes` is the node of each rank, in rank order."""
        if f.kind == "sick-node":
            if f.node is not None:
                return f.node == self.node
            return f.rank is not None and f.rank < len(nodes) and nodes[f.rank] == self.node
        if f.node is not None:  # the lowest rank on that node: one replica is wrong, as with a rank target
            return f.node in nodes and nodes.index(f.node) == self.rank
        return f.rank == self.rank

    def _due(self, kind: str, step: int) -> bool:
        due = [f for f in self.mine if f.kind == kind and f.step == step]
        if due and self.on_fire is not None:
            self.on_fire(due[0], step)
        return bool(due)

    def attach(self, model: nn.Module) -> None:
        """Hook the sick-node drill into `model` (the unwrapped module: the real pass and every recompute
        go through it)."""
        if not any(f.kind == "sick-node" for f in self.mine) and not self.sick:
            return
        handles = perturb_linear_outputs(model, lambda: self.sick)
        if not handles:
            log.warning(
                "FAULT sick-node: the model has no nn.Linear, convolution or Conv1D layer: nothing to perturb"
            )

    def start_of_step(self, step: int) -> None:
        """crash, hang, and the sick-node switch (marker first, so a probe started later sees it)."""
        if self._due("crash", step):
            log.warning("FAULT crash: rank %d SIGKILLs itself at step %d", self.rank, step)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)
        if self._due("hang", step):
            limit = float(os.environ.get("LONGRUN_HANG_S", "3600"))
            log.warning("FAULT hang: rank %d sleeps at step %d for up to %.0f s", self.rank, step, limit)
            deadline = time.monotonic() + limit
            while time.monotonic() < deadline:
                time.sleep(1.0)
        if self._due("sick-node", step):
            marker = sick_marker(self.state_dir, self.node)
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(f"sick from step {step}, eps {SICK_EPS}\n")
            log.warning(
                "FAULT sick-node: node %s perturbs every matmul from step %d (%s)", self.node, step, marker
            )
            self.sick = True

    def local_gradients(self, step: int, grads: torch.Tensor) -> None:
        """nan / inf / scale on this rank's local, not yet averaged, gradient (a flat buffer, in place)."""
        index = grads.numel() // 3  # a fixed element somewhere inside the weights
        for kind, value in (("nan", float("nan")), ("inf", float("inf"))):
            if self._due(kind, step):
                log.warning("FAULT %s: rank %d gradient element %d at step %d", kind, self.rank, index, step)
                grads[index] = value
        if self._due("scale", step):
            index = int(grads.abs().argmax())  # the largest element: surely non-zero, still finite x10
            log.warning(
                "FAULT scale: rank %d gradient element %d x%g at step %d",
                self.rank,
                index,
                SCALE_FACTOR,
                step,
            )
            grads[index] *= SCALE_FACTOR

    def after_update(self, step: int, params: Sequence[torch.Tensor]) -> None:
        """weight-flip: flip one bit of one weight of this replica."""
        if not self._due("weight-flip", step):
            return
        p = max(params, key=lambda t: t.numel())  # the largest matrix
        with torch.no_grad():
            bits = p.data.view(-1).view(torch.int32)
            bits[bits.numel() // 2] ^= 1 << FLIP_BIT
        log.warning(
            "FAULT weight-flip: rank %d flipped bit %d of a weight after step %d", self.rank, FLIP_BIT, step
        )
