"""The guard: longrun's step order around a user's own model, optimizer, data and `loss_fn`.

    guard = Guard(GuardConfig.from_env())                     # process group, records, NVRx, resume point
    ddp = guard.prepare(model, optimizer, loss_fn=loss_fn,    # resume, DDP with longrun's hook, drills
                        scheduler=scheduler, state={"data": loader})
    sys.exit(guard.run(loader))                               # or: with guard: ... guard.step(batch) ...

One step (`step(batch)`), in this order:

1. drills due at the start of the step (crash, hang, sick-node);
2. forward through DDP under the step's RNG fork (seeded from (seed, step, rank): dropout draws the same
   masks in the real pass, in any recompute of it, and after a resume), then backward; DDP's all-reduce runs
   through longrun's communication hook (training.api.gradients), which sees the local gradient first;
3. the checks after the reduce (finite; at audit steps the cross-node recompute, with the micro-batches sent
   between ranks: training.api.peers); a failure skips the update;
4. clip (when configured), optimizer step, scheduler step;
5. drills after the update (weight-flip), then the weight vote (periodically and always before a save);
6. the save, with its manifest and every rank's state (training.api.saves, training.api.state);
7. records: check records, the segment's first healthy step, progress (the heartbeat), NVRx's heartbeat.

A verdict (a failed check, `on_verdict="exit"`) writes the alert first and durably, asks NVRx not to restart
in place, and ends the run with exit code 93 (`schema.EXIT_SDC_VERDICT`): `done` turns true and `close()`
returns 93. What the guard asks of user code: `loss_fn(model, batch)` that is pure given the weights, the
batch and the RNG, with no collectives of its own, and every trainable parameter used in each step.

A sharded model (FSDP2, HSDP) is prepared with `prepare_sharded(model, mesh=..., make_optimizer=...,
loss_fn=...)` instead: the same step order, the finite check on each rank's gradient shard after the
reduce-scatter, the recompute with every rank at once (the loss, and the local gradient where FSDP
reduce-scatters it: training.api.sharded_gradients), the weight vote within
the ranks that hold the same shard, and saves and resumes through training.checkpoint.sharded
(training.api.sharding, docs/adopting.md).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from training.api import sharded_gradients, sharding
from training.api.gradients import LocalGradients
from training.api.peers import LossFn, PeerBatches, to_device
from training.api.records import RunRecords, code_version
from training.api.saves import Saves, ShardedUploads
from training.api.state import (
    StateError,
    Stateful,
    StepRng,
    gather_rank_states,
    rank_state,
    restore_rank_state,
)
from training.checks import build_checks
from training.checks.base import CheckResult, StepContext
from training.config import GuardConfig
from training.dist import device as default_device
from training.dist import gather_strings, init_process_group, placement_from_env, shutdown, use_rank_device
from training.events import EventWriter
from training.faults import Fault, Injector, fault_state_dir, faults_from
from training.fingerprint.host import fingerprint_state, local_state
from training.nvrx.adapter import NvrxMonitor
from training.nvrx.restart import first_incarnation_only, in_job_resume_ref, verdict_already_given
from training.records import schema
from training.segment import Segment, segment_id
from training.spares.standby import directed
from training.store.factory import store_from_env
from training.store.interface import ObjectStore, StoreError
from training.verdict import publish_verdict

log = logging.getLogger("training.api")


SHARDED_CHECKPOINTS = "sharded-checkpoints"
"""Where a sharded run's checkpoints go, under the run dir (not the unsharded saver's `checkpoints/`):
`sharded-checkpoints/<segment id>/step-NNNNNNNN/`, one folder per incarnation of the trainer."""


class SetupError(RuntimeError):
    """The job cannot start deterministically or at all (mismatched ranks, unreadable checkpoint)."""


@dataclass(slots=True, kw_only=True)
class StepOutcome:
    """What one guarded step did."""

    step: int
    """The step taken (counted from 1)."""
    loss: float | None
    """The mean loss over ranks, or None when the update was skipped."""
    results: list[CheckResult] = field(default_factory=list)
    """The checks that ran this step."""
    failed: CheckResult | None = None
    """The check that reached a verdict, if one did."""

    @property
    def skipped(self) -> bool:
        """The update was not applied (a check before the update failed)."""
        return self.failed is not None and self.failed.check != "weight_vote"


class Guard:
    """One rank's guard of a training run; see the module docstring for the step order."""

    def __init__(self, cfg: GuardConfig, *, faults: Sequence[Fault] | None = None) -> None:
        """Join (or check) the process group, start NVRx, and open the run's records and resume point.

        Why one function: it is the rank's start-up sequence, and its order is the contract: every rank
        makes the same collectives in the same order (the node gather, the knob gather), a standby claims
        nothing before its directive, NVRx's restart count decides the faults and the resume point. Each
        step uses what the ones before it set; it reads top to bottom."""
        self.cfg = cfg
        torch.set_num_threads(cfg.threads)
        if cfg.checks.recompute_loss_rtol == 0:
            torch.use_deterministic_algorithms(True)  # the recompute compares bits
        self.place = placement_from_env()
        standby = bool(cfg.await_directive_s)
        self._own_group = not dist.is_initialized()
        if self._own_group:
            self.backend = init_process_group(
                self.place, timeout_s=cfg.collective_timeout_s, claim_device=not standby
            )
        else:
            self.backend = str(dist.get_backend())
            if (dist.get_rank(), dist.get_world_size()) != (self.place.rank, self.place.world_size):
                raise SetupError(
                    f"the process group (rank {dist.get_rank()} of {dist.get_world_size()}) disagrees with the "
                    f"launcher's RANK/WORLD_SIZE ({self.place.rank} of {self.place.world_size})"
                )
        self.nodes = gather_strings(self.place.node)  # one gather at start-up: the node of each rank
        if standby:  # nothing monitored, loaded, written or put on a GPU before its directive
            self.cfg = cfg = directed(cfg, rank=self.place.rank, nodes=self.nodes)
            use_rank_device(self.place)
        self.rank, self.world = self.place.rank, self.place.world_size
        self.device = default_device()
        # NVRx heartbeats (a no-op off ft_launcher); timeouts are calculated once a save and an audit ran.
        self.nvrx = NvrxMonitor.from_env(
            need_saved=bool(cfg.checkpoint_every),
            need_audited=bool(cfg.checks.recompute_every) and "recompute" in cfg.checks.checks,
        )
        self.nvrx.start()
        chosen = tuple(faults) if faults is not None else faults_from([])
        self.faults = first_incarnation_only(chosen, self.nvrx.restart_count)
        # One gather of the knobs the bits depend on (all must agree).
        knobs = f"{torch.__version__}|{torch.backends.cpu.get_cpu_capability()}|threads={cfg.threads}"
        all_knobs = gather_strings(knobs)
        if len(set(all_knobs)) != 1:
            self._shutdown()
            raise SetupError(
                f"ranks disagree on torch version / CPU capability / threads: {all_knobs}; "
                "pin ATEN_CPU_CAPABILITY and the thread count on every rank"
            )
        self.run_dir = Path(cfg.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.store = self._store()
        self.events = EventWriter(
            run=cfg.run,
            run_dir=self.run_dir,
            store=self.store,
            rank=self.rank,
            flush_every=cfg.store_flush_every,
            progress_interval_s=cfg.progress_interval_s,
        )
        self.checks = build_checks(cfg.checks)
        self.rng = StepRng(cfg.seed, self.device)
        self.resume_ref = in_job_resume_ref(
            restart_count=self.nvrx.restart_count,
            default=cfg.resume_from,
            run_dir=self.run_dir,
            run=cfg.run,
            store=self.store,
        )
        self.earlier_verdict = verdict_already_given(
            restart_count=self.nvrx.restart_count, run_dir=self.run_dir, run=cfg.run, store=self.store
        )
        self.start_step = 0
        self._resumed_last_pass: dict[str, int] = {}
        self.resumed_from: str | None = None
        self.exit_code: int | None = None
        """0 once every step ran, 93 after a verdict (None while training)."""
        self._records: RunRecords | None = None
        self._closed = False
        self.mesh: Any = None
        """The DeviceMesh of a sharded model (`prepare_sharded`); None under DDP."""
        self.grad_tap: sharded_gradients.ReduceScatterTap | None = None
        """Where a sharded model's local gradient is seen at audit steps (None: DDP, or not seeable)."""
        self._save_group: Any = None
        """The process group of a sharded run's async saves (None: saves are synchronous, or closed)."""
        self._async_saves = False
        self._pending_save: Any = None
        """This rank's latest sharded save (training.checkpoint.sharded.PendingShardedSave)."""

    # ---- set-up ------------------------------------------------------------------------------------

    def _store(self) -> ObjectStore | None:
        if not self.cfg.use_store:
            return None
        try:
            return store_from_env()
        except StoreError as e:
            raise SetupError(f"object store: {e}") from e

    def prepare(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        loss_fn: LossFn,
        scheduler: Any = None,
        state: Mapping[str, Stateful] | None = None,
        ddp_options: Mapping[str, Any] | None = None,
    ) -> DistributedDataParallel:
        """Resume (weights, optimizer, scheduler, every object in `state`, this rank's RNG) from the resume
        point, hook the drills into `model`, and wrap it in DDP with longrun's communication hook. Returns
        the DDP module; `loss_fn` gets it in the real pass and the unwrapped `model` in a recompute.

        Why one function: it is one ordered set-up sequence (resume, records and segment, the drills' hooks,
        DDP and its communication hook, the segment record, saves, an earlier verdict's exit), each step
        using what the ones before it set on the guard; it reads top to bottom."""
        if self._records is not None:
            raise RuntimeError("Guard.prepare() was already called")
        self.module = model.to(self.device)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.loss_fn = loss_fn
        self.state = dict(state or {})
        for name, obj in self.state.items():
            if not isinstance(obj, Stateful):
                raise TypeError(
                    f"state[{name!r}] = {type(obj).__name__} has no state_dict()/load_state_dict()"
                )
        self.params = [p for p in model.parameters() if p.requires_grad]
        if self.resume_ref:
            self._resume(self.resume_ref)
            self.resumed_from = self.resume_ref
        self._records = RunRecords(
            run=self.cfg.run, rank=self.rank, world=self.world, node=self.place.node, nodes=self.nodes,
            events=self.events, segment=self._new_segment(),
        )  # fmt: skip
        self._records.last_pass = dict(self._resumed_last_pass)
        self.injector = Injector(
            self.faults,
            rank=self.rank,
            node=self.place.node,
            nodes=self.nodes,
            state_dir=fault_state_dir(self.run_dir / "fault-state"),
            on_fire=self._records.fault_fired,
        )
        self.injector.attach(model)
        options = {"forward_sync_buffers": False, "find_unused_parameters": True, **dict(ddp_options or {})}
        device_ids = [self.device] if self.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(model, device_ids=device_ids, **options)
        self.hook = LocalGradients(params=self.params, world=self.world, injector=self.injector)
        self.ddp.register_comm_hook(None, self.hook.as_hook())
        self._records.write_segment()
        self.saves = Saves(
            run=self.cfg.run, run_dir=self.run_dir, store=self.store, world=self.world, nodes=self.nodes,
            seed=self.cfg.seed, enabled=self.rank == 0 and bool(self.cfg.checkpoint_every),
        )  # fmt: skip
        if self.earlier_verdict and self.cfg.checks.on_verdict == "exit":
            log.error("in-job restart after this launch's SDC verdict (%s): exiting 93", self.earlier_verdict)
            self.nvrx.request_shutdown(f"SDC verdict already given in this launch: {self.earlier_verdict}")
            self.exit_code = schema.EXIT_SDC_VERDICT
        log.info(
            "rank %d/%d on %s (%s, %s): model %d params, checks %s, start step %d",
            self.rank, self.world, self.place.node, self.backend, self.device,
            sum(p.numel() for p in self.params), [c.name for c in self.checks], self.start_step,
        )  # fmt: skip
        return self.ddp

    def device_mesh(self, parallelism: str) -> Any:
        """The DeviceMesh `prepare_sharded` takes for `parallelism` (`fsdp` or `hsdp`; `ddp` gives None: use
        `prepare`), laid out over this job's nodes: HSDP shards within a node and replicates across nodes
        (training.api.sharding.mesh_for). Every rank calls it. SetupError on every rank alike when the job's
        layout does not allow it (one node for hsdp, unequal or interleaved ranks per node)."""
        try:
            return sharding.mesh_for(parallelism, nodes=self.nodes, device_type=self.device.type)
        except ValueError as e:
            raise SetupError(str(e)) from e

    def prepare_sharded(
        self,
        model: nn.Module,
        *,
        mesh: Any,
        make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
        loss_fn: LossFn,
        make_scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
        state: Mapping[str, Stateful] | None = None,
    ) -> nn.Module:
        """`prepare` for a sharded model: `fully_shard(model, mesh=mesh)` (FSDP2 on a ("shard",) mesh, HSDP
        on a ("replicate", "shard") mesh; training.api.sharding), then the optimizer and the scheduler built
        by `make_optimizer(params)` and `make_scheduler(optimizer)` over the sharded parameters (FSDP2
        replaces the parameters, so an optimizer built before sharding would update the old ones), then the
        resume through training.checkpoint.sharded. Returns the sharded module; `loss_fn` gets it.

        Refused with SetupError on every rank alike (the configuration is the same on every rank), before
        any collective: a mesh other than those two, and a weight vote where no shard has two holders.
        `grad_clip` clips by the whole model's gradient norm, as under DDP (`sharding.clip_gradients`).
        Checkpoints go to
        `<run dir>/sharded-checkpoints/` (a folder every rank must see); the records are the DDP path's.

        Why one function: like `prepare`, one ordered set-up sequence (refusals, sharding, the optimizer over
        the sharded parameters, resume, records, drills, segment, an earlier verdict's exit), each step
        using what the ones before it set; it reads top to bottom."""
        if self._records is not None:
            raise RuntimeError("Guard.prepare() was already called")
        try:
            layout = sharding.mesh_layout(mesh, self.world)
            sharding.sharded_checks(self.checks, layout, gradients=False)  # its refusals, before sharding
        except ValueError as e:
            raise SetupError(str(e)) from e
        self.mesh, self.loss_fn = mesh, loss_fn
        self.state = self._checked_state(state)
        self.module = sharding.shard(model.to(self.device), mesh)
        self.grad_tap = sharded_gradients.install(self.module, mesh)
        self.checks = sharding.sharded_checks(self.checks, layout, gradients=self.grad_tap is not None)
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(list(self.module.parameters()))
        self.scheduler = make_scheduler(self.optimizer) if make_scheduler is not None else None
        if self.resume_ref:
            self._resume_sharded(self.resume_ref)
            self.resumed_from = self.resume_ref
        self._records = RunRecords(
            run=self.cfg.run, rank=self.rank, world=self.world, node=self.place.node, nodes=self.nodes,
            events=self.events, segment=self._new_segment(),
        )  # fmt: skip
        self._records.last_pass = dict(self._resumed_last_pass)
        self.injector = Injector(
            self.faults, rank=self.rank, node=self.place.node, nodes=self.nodes,
            state_dir=fault_state_dir(self.run_dir / "fault-state"), on_fire=self._records.fault_fired,
        )  # fmt: skip
        self.injector.attach(self.module)
        self.ddp = None  # type: ignore[assignment]
        self.saves = Saves(
            run=self.cfg.run, run_dir=self.run_dir, store=self.store, world=self.world, nodes=self.nodes,
            seed=self.cfg.seed, enabled=False,
        )  # fmt: skip
        self.sharded_uploads = ShardedUploads(run=self.cfg.run, store=self.store if self.rank == 0 else None)
        # Rank 0's segment id names the incarnation's checkpoint folder on every rank (outside Slurm the
        # ranks' own ids carry their start times, which may differ).
        incarnation: list[object] = [self._records.segment.segment_id]
        if self.world > 1:
            dist.broadcast_object_list(incarnation, src=0)
        self._sharded_dir = self.run_dir / SHARDED_CHECKPOINTS / str(incarnation[0])
        if self.cfg.async_save and self.cfg.checkpoint_every and self.world > 1:
            # DCP's background thread runs collectives of its own: on a group nobody else uses, on the CPU
            # (gloo), so they can never interleave with the training's.
            self._save_group = dist.new_group(
                backend="gloo", timeout=datetime.timedelta(seconds=self.cfg.collective_timeout_s)
            )
            self._async_saves = True
        self._records.write_segment()
        if self.earlier_verdict and self.cfg.checks.on_verdict == "exit":
            log.error("in-job restart after this launch's SDC verdict (%s): exiting 93", self.earlier_verdict)
            self.nvrx.request_shutdown(f"SDC verdict already given in this launch: {self.earlier_verdict}")
            self.exit_code = schema.EXIT_SDC_VERDICT
        log.info(
            "rank %d/%d on %s (%s, %s): sharded model (%s), checks %s, start step %d",
            self.rank, self.world, self.place.node, self.backend, self.device, layout.describe(),
            [c.name for c in self.checks], self.start_step,
        )  # fmt: skip
        return self.module

    @staticmethod
    def _checked_state(state: Mapping[str, Stateful] | None) -> dict[str, Stateful]:
        out = dict(state or {})
        for name, obj in out.items():
            if not isinstance(obj, Stateful):
                raise TypeError(
                    f"state[{name!r}] = {type(obj).__name__} has no state_dict()/load_state_dict()"
                )
        return out

    def _resume_sharded(self, ref: str) -> None:
        """Every rank loads `ref` (a sharded checkpoint folder every rank sees) onto the same mesh."""
        from training.checkpoint.sharded import load_sharded, read_sharded_extra

        try:
            folder = self._sharded_folder(ref)
            manifest = load_sharded(folder, self.module, self.optimizer, mesh=self.mesh)
            extra = read_sharded_extra(folder) or {}
            if self.scheduler is not None:
                if "scheduler" not in extra:
                    raise StateError(f"{ref} has no scheduler state, but a scheduler was given")
                self.scheduler.load_state_dict(extra["scheduler"])
            restore_rank_state(extra.get("ranks"), self.state, rank=self.rank, world=self.world, where=ref)
        except Exception as e:
            raise SetupError(f"cannot resume from {ref!r}: {e}") from e
        self.start_step = int(manifest["step"])
        self._resumed_last_pass = dict(manifest["extra"].get("last_pass", {}))
        log.info("resumed the sharded model from %s at step %d", ref, self.start_step)

    def _sharded_folder(self, ref: str) -> Path:
        """The local folder of the sharded checkpoint `ref`: `ref` itself when it is a folder, else a store
        key prefix that rank 0 fetches (and checks whole: training.checkpoint.sharded_store.fetch_sharded)
        into `<run dir>/resume/<its name>/`, a folder every rank must see. Rank 0's outcome is broadcast, so
        every rank fails alike."""
        from training.checkpoint.sharded_store import fetch_sharded

        if Path(ref).is_dir():
            return Path(ref)
        dest = self.run_dir / "resume" / ref.rstrip("/").rsplit("/", 1)[-1]
        error: list[object] = [None]
        if self.rank == 0:
            try:
                if self.store is None:
                    raise StateError(
                        f"{ref!r} is not a local folder, and this run has no store to fetch it from"
                    )
                shutil.rmtree(dest, ignore_errors=True)  # an earlier incarnation's partial fetch
                fetch_sharded(self.store, ref, dest)
            except Exception as e:
                error[0] = f"{type(e).__name__}: {e}"
        if self.world > 1:
            dist.broadcast_object_list(error, src=0)
        if error[0] is not None:
            raise StateError(f"fetching the sharded checkpoint {ref!r} failed on rank 0: {error[0]}")
        return dest

    def _new_segment(self) -> Segment:
        started_at = time.time()
        return Segment(
            run=self.cfg.run,
            segment_id=segment_id(
                job_id=os.environ.get("SLURM_JOB_ID"),
                job_step=os.environ.get("SLURM_STEP_ID"),
                restart_count=self.nvrx.restart_count,
                started_at=started_at,
            ),
            job_id=os.environ.get("SLURM_JOB_ID"),
            restart_count=self.nvrx.restart_count,
            start_step=self.start_step,
            resumed_from=self.resumed_from,
            started_at=started_at,
            world_size=self.world,
            nodes=tuple(self.nodes),
        )

    def _resume(self, ref: str) -> None:
        from training.checkpoint.load import load_checkpoint

        try:
            ckpt = load_checkpoint(ref, store=self.store)
            self.module.load_state_dict(ckpt.model_state)
            self.optimizer.load_state_dict(ckpt.optim_state)
            extra = ckpt.extra
            if self.scheduler is not None:
                if "scheduler" not in extra:
                    raise StateError(f"{ref} has no scheduler state, but a scheduler was given")
                self.scheduler.load_state_dict(extra["scheduler"])
            if "ranks" in extra:
                restore_rank_state(extra["ranks"], self.state, rank=self.rank, world=self.world, where=ref)
            elif self.state:
                raise StateError(f"{ref} holds no per-rank state, but state={sorted(self.state)} was given")
            else:
                log.warning("%s holds no per-rank state (an older checkpoint): the RNG is not restored", ref)
        except Exception as e:
            raise SetupError(f"cannot resume from {ref!r}: {e}") from e
        self.start_step = int(extra.get("step", ckpt.step))
        self._resumed_last_pass = dict(extra.get("last_pass", {}))
        log.info("resumed from %s at step %d", ref, self.start_step)

    # ---- the loop ----------------------------------------------------------------------------------

    @property
    def records(self) -> RunRecords:
        if self._records is None:
            raise RuntimeError("call Guard.prepare() before training")
        return self._records

    @property
    def next_step(self) -> int:
        """The step the next `step()` call takes."""
        last = self.records.last_step
        return (last if last is not None else self.start_step) + 1

    @property
    def done(self) -> bool:
        """Every step ran, or a verdict ended the run: stop calling `step()`."""
        return self.exit_code is not None or self.next_step > self.cfg.steps

    def run(self, batches: Iterable[Any]) -> int:
        """Train on `batches` (one micro-batch per step, this rank's) until `done`, then close. Returns the
        exit code for `sys.exit`: 0, or 93 after an SDC verdict."""
        with self:
            if self.exit_code is None and self.done:  # resumed at the last step: nothing left to train
                self.records.report(final_step=self.cfg.steps, fingerprints=self._final_fingerprints())
                self.exit_code = 0
            it = iter(batches)
            while not self.done:
                try:
                    batch = next(it)
                except StopIteration:
                    raise RuntimeError(
                        f"the data ran out before step {self.next_step} of {self.cfg.steps}"
                    ) from None
                self.step(batch)
        assert self.exit_code is not None
        return self.exit_code

    def step(self, batch: Any) -> StepOutcome:
        """One guarded training step on this rank's micro-batch `batch` (its tensors are moved to the
        guard's device; mappings become dicts)."""
        if self.done:
            raise RuntimeError(f"Guard.step() after the run ended (exit code {self.exit_code})")
        records = self.records
        step = self.next_step
        t0 = time.perf_counter()
        if records.segment.first_step is None:
            records.segment = dataclasses.replace(records.segment, first_step=step)
        records.last_step = step
        loss, results, failed = self._train_step(step, to_device(batch, self.device))
        self._after_step(step, loss, results, failed, time.perf_counter() - t0)
        return StepOutcome(step=step, loss=loss, results=results, failed=failed)

    def _train_step(
        self, step: int, batch: Any
    ) -> tuple[float | None, list[CheckResult], CheckResult | None]:
        if self.mesh is not None:
            return self._train_step_sharded(step, batch)
        cfg = self.cfg
        saving = bool(cfg.checkpoint_every) and step % cfg.checkpoint_every == 0
        due = [c for c in self.checks if c.due(step, saving=saving)]
        audit = self.world > 1 and any(c.name == "recompute" for c in due)
        self.injector.start_of_step(step)
        self.optimizer.zero_grad(set_to_none=True)
        self.hook.begin(step, audit=audit)
        loss = self.rng(step, self.rank, lambda: self.loss_fn(self.ddp, batch))
        self.hook.loss = loss.detach()
        loss.backward()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        grad_norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        mean_loss = self._mean_loss(loss)
        ctx = StepContext(
            step=step, rank=self.rank, nodes=self.nodes, device=self.device, model=self.module,
            loss=loss.detach(), local_nonfinite=self.hook.nonfinite,
            own_grad_fingerprint=self.hook.fingerprint() if audit else None,
            peers=self._peers(step, batch) if audit else None, saving=saving, grad_norm=grad_norm,
        )  # fmt: skip
        results: list[CheckResult] = []
        for c in due:
            r = c.after_reduce(ctx)
            if r is not None:
                results.append(r)
                if r.failed:
                    return None, results, r  # the update is not applied
        if cfg.grad_clip is not None:
            coef = cfg.grad_clip / (grad_norm + 1e-6)
            if float(coef) < 1.0:
                for g in grads:
                    g.mul_(coef)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.injector.after_update(step, self.params)
        for c in due:
            r = c.after_update(ctx)
            if r is not None:
                results.append(r)
                if r.failed:
                    return mean_loss, results, r
        if saving:
            self._save(step, mean_loss, results)
        return mean_loss, results, None

    def _train_step_sharded(
        self, step: int, batch: Any
    ) -> tuple[float | None, list[CheckResult], CheckResult | None]:
        """`_train_step` for a sharded model: the same order, but the gradient is looked at after FSDP's
        reduce-scatter (each rank's shard; training.api.sharding), and the recompute at an audit step is a
        forward pass of every rank at once, before the optimizer step (the pre-update weights)."""
        saving = bool(self.cfg.checkpoint_every) and step % self.cfg.checkpoint_every == 0
        due = [c for c in self.checks if c.due(step, saving=saving)]
        audit = self.world > 1 and any(c.name == "recompute" for c in due)
        self.injector.start_of_step(step)
        self.optimizer.zero_grad(set_to_none=True)
        tap = self.grad_tap if audit else None
        if tap is not None:
            tap.arm()
        try:
            loss = self.rng(step, self.rank, lambda: self.loss_fn(self.module, batch))
            loss.backward()  # FSDP reduce-scatters (and, HSDP, all-reduces over replicas) before it returns
            own_grad_fingerprint = tap.fingerprint() if tap is not None else None
        finally:
            if tap is not None:
                tap.disarm()
        grads = sharding.local_grads(self.params)
        sharding.gradient_drills(self.injector, step, grads)
        mean_loss = sharding.mean_loss(loss, self.world)
        ctx = StepContext(
            step=step, rank=self.rank, nodes=self.nodes, device=self.device, model=self.module,
            loss=loss.detach(), local_nonfinite=sharding.nonfinite(grads), saving=saving,
            own_grad_fingerprint=own_grad_fingerprint, peers=self._peers(step, batch) if audit else None,
        )  # fmt: skip
        results: list[CheckResult] = []
        for c in due:
            r = c.after_reduce(ctx)
            if r is not None:
                results.append(r)
                if r.failed:
                    return None, results, r  # the update is not applied
        if self.cfg.grad_clip is not None:
            sharding.clip_gradients(self.params, self.cfg.grad_clip)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.injector.after_update(step, sharding.local_params(self.params))
        for c in due:
            r = c.after_update(ctx)
            if r is not None:
                results.append(r)
                if r.failed:
                    return mean_loss, results, r
        if saving:
            self._save_sharded(step, mean_loss, results)
        return mean_loss, results, None

    def _save_sharded(self, step: int, loss: float, results: list[CheckResult]) -> None:
        """Every rank saves its shards (training.checkpoint.sharded) into
        `<run dir>/sharded-checkpoints/<segment id>/step-NNNNNNNN/`; rank 0 adds every rank's state and the
        scheduler. With `async_save` the step waits only for the copy of the state to host memory; the
        files are written in the background and rank 0 writes the manifest and uploads once every rank's
        files are written (ShardedUploads). One save at a time: a rank waits for its previous write first,
        so the background collectives of two saves never interleave."""
        from training.checkpoint.sharded import start_sharded_save

        if self._pending_save is not None:
            self._wait_for_last_save()
        ranks = gather_rank_states(rank_state(self.state), rank=self.rank, world=self.world)
        extra_state: dict[str, Any] | None = None
        if self.rank == 0:
            extra_state = {"ranks": ranks}
            if self.scheduler is not None:
                extra_state["scheduler"] = self.scheduler.state_dict()
        passed = {**self.records.last_pass, **{r.check: step for r in results if r.verdict == "pass"}}
        # One folder per incarnation: a relaunch or an in-job restart that trains this step again must not
        # meet the folder an earlier one left (the store keeps the copy that was published first).
        folder = self._sharded_dir / f"step-{step:08d}"
        pending = start_sharded_save(
            folder, self.module, self.optimizer, step=step, mesh=self.mesh, extra_state=extra_state,
            extra={"run": self.cfg.run, "loss": loss, "seed": self.cfg.seed, "last_pass": passed},
            async_group=self._save_group, timeout_s=self.cfg.collective_timeout_s,
        )  # fmt: skip
        self._pending_save = pending
        log.info(
            "sharded checkpoint of step %d %s %s",
            step,
            "saving to" if self._save_group else "saved in",
            folder,
        )
        if self.rank == 0:
            fields = self.saves.manifest_fields(
                step=step, loss=loss, results=results, passed=passed, fingerprints={}
            )
            self.sharded_uploads.submit(step=step, folder=folder, manifest_fields=fields, pending=pending)

    def _mean_loss(self, loss: torch.Tensor) -> float:
        total = self.hook.loss_sum
        if total is None:  # gradients the hook could not pack the loss into (e.g. bf16), or one rank
            total = loss.detach().reshape(1).to(torch.float64)
            if self.world > 1:
                dist.all_reduce(total)
        return float(total.item()) / self.world

    def _peers(self, step: int, batch: Any) -> PeerBatches:
        wire = self.device if self.backend == "nccl" else torch.device("cpu")
        return PeerBatches(
            batch=batch, step=step, rank=self.rank, world=self.world, module=self.module, params=self.params,
            loss_fn=self.loss_fn, forward=self.rng, device=self.device, wire=wire, grad_tap=self.grad_tap,
        )  # fmt: skip

    def _save(self, step: int, loss: float, results: list[CheckResult]) -> None:
        mine = rank_state(self.state)
        ranks = gather_rank_states(mine, rank=self.rank, world=self.world)  # every rank takes part
        if self.rank != 0:
            return
        extra: dict[str, Any] = {"ranks": ranks}
        if self.scheduler is not None:
            extra["scheduler"] = self.scheduler.state_dict()
        self.saves.save(
            step=step, loss=loss, results=results, last_pass=self.records.last_pass, model=self.module,
            optimizer=self.optimizer, extra=extra, events=self.events,
        )  # fmt: skip

    def _after_step(
        self,
        step: int,
        loss: float | None,
        results: list[CheckResult],
        failed: CheckResult | None,
        step_time: float,
    ) -> None:
        records = self.records
        if failed is None and records.segment.first_healthy_step is None:
            records.write_segment(first_healthy_step=step, first_healthy_time=time.time())
        if failed is not None:
            publish_verdict(
                failed,
                run=self.cfg.run,
                rank=self.rank,
                nodes=self.nodes,
                events=self.events,
                context={"rank_of_writer": self.rank, "code_version": code_version()},
            )
        records.checks(results, loss)
        if failed is not None and self.cfg.checks.on_verdict == "exit":
            # The alert is durable: ask ft_launcher not to restart in place, then exit 93.
            self.nvrx.request_shutdown(f"SDC verdict: {failed.check} at step {step}")
            records.end_segment("sdc_verdict")  # before the uploads' drain, which may be cut short
            self.exit_code = schema.EXIT_SDC_VERDICT
            return
        self.nvrx.step_done(
            step,
            saved=bool(self.cfg.checkpoint_every) and step % self.cfg.checkpoint_every == 0,
            audited=any(r.check == "recompute" for r in results),
        )
        self.events.progress(
            schema.record(
                "progress",
                run=self.cfg.run,
                step=step,
                loss=loss,
                step_time_s=round(step_time, 6),
                total_steps=self.cfg.steps,
                world_size=self.world,
                skipped=failed is not None and failed.check != "weight_vote",
                restart_count=self.nvrx.restart_count,
                nvrx=self.nvrx.info(),
                start_step=records.segment.start_step,
                resumed_from=self.resumed_from,
                segment=records.segment.segment_id,
            )  # fmt: skip
        )
        if step >= self.cfg.steps:
            records.report(final_step=self.cfg.steps, fingerprints=self._final_fingerprints())
            self.exit_code = 0

    def _final_fingerprints(self) -> dict[str, str]:
        """The fingerprints the run report compares runs by: the whole model's (rank 0's replica) under DDP;
        under sharding every rank's shards, gathered to every rank and named `<rank>/<tensor>`, so two
        runs compare equal only when every shard is."""
        mine = fingerprint_state(local_state(self.module.state_dict()))
        if self.mesh is None or self.world == 1:
            return mine
        every: list[object] = [None] * self.world
        dist.all_gather_object(every, mine)
        return {f"{r}/{name}": fp for r, fps in enumerate(every) for name, fp in dict(fps).items()}  # type: ignore[call-overload]

    # ---- the end -----------------------------------------------------------------------------------

    def __enter__(self) -> Guard:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(error=exc_type is not None)

    def close(self, *, error: bool = False) -> int:
        """End the segment, drain the saves, flush the records, leave the process group. Returns the exit
        code (an unfinished run without a verdict is an error: 1). Idempotent."""
        code = self.exit_code if self.exit_code is not None else 1
        if self._closed:
            return code
        self._closed = True
        if self._records is not None:
            outcome = (
                "sdc_verdict"
                if code == schema.EXIT_SDC_VERDICT
                else ("done" if code == 0 and not error else "error")
            )
            self._records.end_segment(outcome)
        # No heartbeats while the last uploads drain: stop NVRx's hang watch first (the saver's own timeout
        # bounds the wait).
        self.nvrx.close()
        saves = getattr(self, "saves", None)
        uploads = getattr(self, "sharded_uploads", None)
        writing = self._pending_save is not None
        if (
            (saves is not None and saves.saver is not None)
            or (uploads is not None and uploads.active)
            or writing
        ):
            # ft_launcher SIGTERMs the surviving workers when it restarts them (SIGKILL after its
            # workers-stop timeout): finish the pending saves first, else the restart finds no complete
            # checkpoint of this launch and starts over.
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if saves is not None:
                saves.close()
            if writing:
                self._wait_for_last_save()
            if uploads is not None:
                uploads.close()
        self._close_save_group()
        self.events.close()
        self.ddp = None  # type: ignore[assignment]  # DDP must not hold the last reference to the group
        self._shutdown()
        sys.stdout.flush()
        if code == schema.EXIT_SDC_VERDICT:
            logging.shutdown()
        return code

    @property
    def saves_in_background(self) -> bool:
        """A sharded run's checkpoints are written by `dcp.async_save` (GuardConfig.async_save, with
        checkpoints on and more than one rank)."""
        return self._async_saves

    def _wait_for_last_save(self) -> None:
        """This rank's part of the last sharded save written, before the next save or before the process
        group goes (its background collectives need it), for at most `collective_timeout_s` (the save
        group's own timeout: a peer that died mid-write ends the wait). A write that failed or did not end
        is logged and training goes on: that save has no manifest and is never used. Every rank sees the
        same failure (DCP passes a rank's failure to all), so every rank goes on alike."""
        pending, self._pending_save = self._pending_save, None
        try:
            pending.wait(timeout_s=self.cfg.collective_timeout_s)
        except Exception as e:  # DCP's failure or the wait's end, whatever its type
            log.error("a sharded save did not complete on rank %d: %r; it is never used", self.rank, e)

    def _close_save_group(self) -> None:
        """The async saves' gloo group goes with the guard (a caller who owns the default group may run
        several guards on it)."""
        group, self._save_group = self._save_group, None
        if group is not None:
            try:
                dist.destroy_process_group(group)
            except (RuntimeError, ValueError) as e:  # already gone with a failed peer
                log.warning("the sharded saves' process group: %s", e)

    def _shutdown(self) -> None:
        if not self._own_group:
            return
        try:
            shutdown()
        except RuntimeError as e:  # a peer is gone (crash drill); nothing left to coordinate
            log.warning("process group shutdown: %s", e)
