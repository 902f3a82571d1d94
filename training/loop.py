"""The training loop of the reference trainer (see training/train.py for the CLI and the design)."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from training import schema
from training.checks import CheckResult, StepContext, build_checks
from training.config import TrainConfig
from training.data import micro_batch
from training.dist import device as default_device
from training.dist import gather_strings, init_process_group, placement_from_env, shutdown, use_rank_device
from training.events import EventWriter
from training.faults import Fault, Injector, fault_state_dir
from training.model import build_model
from training.nvrx import NvrxMonitor
from training.nvrx_restart import first_incarnation_only, in_job_resume_ref, verdict_already_given
from training.segment import Segment, segment_id
from training.standby import directed
from training.store import ObjectStore, StoreError, store_from_env
from training.trainer_checkpoints import TrainerCheckpoints
from training.trainer_records import RunRecords, code_version
from training.verdict import publish_verdict

log = logging.getLogger("training.loop")


class SetupError(RuntimeError):
    """The job cannot start deterministically or at all (mismatched ranks, unreadable checkpoint)."""


class Trainer(RunRecords, TrainerCheckpoints):
    def __init__(self, cfg: TrainConfig, faults: tuple[Fault, ...]) -> None:
        self.cfg = cfg
        torch.set_num_threads(cfg.threads)
        torch.use_deterministic_algorithms(True)
        self.place = placement_from_env()
        standby = bool(cfg.await_directive_s)
        self.backend = init_process_group(
            self.place, timeout_s=cfg.collective_timeout_s, claim_device=not standby
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
        faults = first_incarnation_only(faults, self.nvrx.restart_count)
        # One gather of the knobs the bits depend on (all must agree).
        knobs = f"{torch.__version__}|{torch.backends.cpu.get_cpu_capability()}|threads={cfg.threads}"
        all_knobs = gather_strings(knobs)
        if len(set(all_knobs)) != 1:
            shutdown()
            raise SetupError(
                f"ranks disagree on torch version / CPU capability / threads: {all_knobs}; "
                "pin ATEN_CPU_CAPABILITY and --threads on every rank"
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
        self.model = build_model(cfg.model, seed=cfg.seed, device=self.device)
        self.params = [p for p in self.model.parameters()]
        self.n = sum(p.numel() for p in self.params)
        # One flat buffer: the gradient, then the check slots. p.grad are views into it, so the optimizer
        # reads the averaged gradient in place after the all-reduce.
        self.flat = torch.zeros(self.n + StepContext.SLOTS, device=self.device)
        self.scratch = torch.zeros(self.n, device=self.device)
        offset = 0
        for p in self.params:
            p.grad = self.flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        self.optim = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=0.01, foreach=False)
        self.checks = build_checks(cfg.checks)
        self.injector = Injector(
            faults,
            rank=self.rank,
            node=self.place.node,
            nodes=self.nodes,
            state_dir=fault_state_dir(self.run_dir / "fault-state"),
            on_fire=self._fault_fired,
        )
        self.start_step = 0
        self.last_pass: dict[str, int] = {}
        resume = in_job_resume_ref(
            restart_count=self.nvrx.restart_count,
            default=cfg.resume_from,
            run_dir=self.run_dir,
            run=cfg.run,
            store=self.store,
        )
        self.earlier_verdict = verdict_already_given(
            restart_count=self.nvrx.restart_count, run_dir=self.run_dir, run=cfg.run, store=self.store
        )
        self.resumed_from: str | None = None
        self._last_step: int | None = None
        if resume:
            self._resume(resume)
            self.resumed_from = resume
        started_at = time.time()
        self.segment = Segment(
            run=cfg.run,
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
        self._write_segment()
        self.saver = self._saver() if self.rank == 0 and cfg.checkpoint_every else None
        log.info(
            "rank %d/%d on %s (%s, %s): model %d params, checks %s, start step %d",
            self.rank, self.world, self.place.node, self.backend, self.device, self.n,
            [c.name for c in self.checks], self.start_step,
        )  # fmt: skip

    # ---- set-up ------------------------------------------------------------------------------------

    def _store(self) -> ObjectStore | None:
        if not self.cfg.use_store:
            return None
        try:
            return store_from_env()
        except StoreError as e:
            raise SetupError(f"object store: {e}") from e

    def _resume(self, ref: str) -> None:
        from training.checkpointing import load_checkpoint

        try:
            ckpt = load_checkpoint(ref, store=self.store)
        except Exception as e:
            raise SetupError(f"cannot resume from {ref!r}: {e}") from e
        self.model.load_state_dict(ckpt.model_state)
        self.optim.load_state_dict(ckpt.optim_state)
        # load_state_dict replaced nothing in p.grad, but make sure the views survived.
        for p in self.params:
            assert p.grad is not None and p.grad.data_ptr() >= self.flat.data_ptr()
        self.start_step = int(ckpt.extra.get("step", ckpt.step))
        self.last_pass = dict(ckpt.extra.get("last_pass", {}))
        log.info("resumed from %s at step %d", ref, self.start_step)

    # ---- one step ----------------------------------------------------------------------------------

    def _grads(self, rank: int, step: int, out: torch.Tensor) -> torch.Tensor:
        """Loss of rank `rank`'s micro-batch of `step`; its local gradient written into out[:n]."""
        batch = micro_batch(self.cfg.model, seed=self.cfg.seed, step=step, rank=rank).to(self.device)
        loss = self.model.loss(batch)
        grads = torch.autograd.grad(loss, self.params)
        torch.cat([g.reshape(-1) for g in grads], out=out[: self.n])
        return loss.detach()

    def step(self, step: int) -> tuple[float | None, list[CheckResult], CheckResult | None]:
        """One training step. Returns (mean loss or None if skipped, results, the failed result)."""
        saving = bool(self.cfg.checkpoint_every) and step % self.cfg.checkpoint_every == 0
        due = [c for c in self.checks if c.due(step, saving=saving)]
        self.injector.start_of_step(step, self.model.matmul)
        loss = self._grads(self.rank, step, self.flat)
        self.injector.local_gradients(step, self.flat[: self.n])
        self.flat[self.n + StepContext.FLAG] = 0.0
        self.flat[self.n + StepContext.LOSS] = loss

        def compute(r: int) -> tuple[torch.Tensor, torch.Tensor]:
            return self._grads(r, step, self.scratch), self.scratch

        ctx = StepContext(
            step=step, rank=self.rank, nodes=self.nodes, device=self.device, model=self.model,
            flat=self.flat, n=self.n, loss=loss, compute=compute, saving=saving,
        )  # fmt: skip
        for c in due:
            c.before_reduce(ctx)
        if self.world > 1:
            dist.all_reduce(self.flat)
            self.flat[: self.n].div_(self.world)
        ctx.grad_norm = torch.linalg.vector_norm(self.flat[: self.n])
        mean_loss = float(self.flat[self.n + StepContext.LOSS].item()) / self.world
        results: list[CheckResult] = []
        for c in due:
            r = c.after_reduce(ctx)
            if r is not None:
                results.append(r)
                if r.failed:
                    return None, results, r  # the update is not applied
        # Clip by the norm already computed (it was the averaged side of the finite check).
        coef = self.cfg.grad_clip / (ctx.grad_norm + 1e-6)
        if float(coef) < 1.0:
            self.flat[: self.n].mul_(coef)
        self.optim.step()
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

    # ---- the run (its records: training.trainer_records; its saves: training.trainer_checkpoints) ----

    def run(self) -> int:
        code = 0
        outcome = "error"
        try:
            code = self._loop()
            outcome = "sdc_verdict" if code == schema.EXIT_SDC_VERDICT else "done"
        finally:
            self._end_segment(outcome)
            self._close()
        if code == schema.EXIT_SDC_VERDICT:
            logging.shutdown()
        return code

    def _loop(self) -> int:
        if self.earlier_verdict and self.cfg.checks.on_verdict == "exit":
            log.error("in-job restart after this launch's SDC verdict (%s): exiting 93", self.earlier_verdict)
            self.nvrx.request_shutdown(f"SDC verdict already given in this launch: {self.earlier_verdict}")
            return schema.EXIT_SDC_VERDICT
        for step in range(self.start_step + 1, self.cfg.steps + 1):
            t0 = time.perf_counter()
            if self.segment.first_step is None:
                self.segment = dataclasses.replace(self.segment, first_step=step)
            self._last_step = step
            mean_loss, results, failed = self.step(step)
            step_time = time.perf_counter() - t0
            if failed is None and self.segment.first_healthy_step is None:
                self._write_segment(first_healthy_step=step, first_healthy_time=time.time())
            if failed is not None:
                publish_verdict(
                    failed,
                    run=self.cfg.run,
                    rank=self.rank,
                    nodes=self.nodes,
                    events=self.events,
                    context={"rank_of_writer": self.rank, "code_version": code_version()},
                )
                self._record(results, mean_loss)
                if self.cfg.checks.on_verdict == "exit":
                    # The alert is durable: ask ft_launcher not to restart in place, then exit 93.
                    self.nvrx.request_shutdown(f"SDC verdict: {failed.check} at step {step}")
                    self._end_segment("sdc_verdict")  # before the uploads' drain, which may be cut short
                    return schema.EXIT_SDC_VERDICT
            else:
                self._record(results, mean_loss)
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
                    loss=mean_loss,
                    step_time_s=round(step_time, 6),
                    total_steps=self.cfg.steps,
                    world_size=self.world,
                    skipped=failed is not None and failed.check != "weight_vote",
                    restart_count=self.nvrx.restart_count,
                    nvrx=self.nvrx.info(),
                    start_step=self.segment.start_step,
                    resumed_from=self.resumed_from,
                    segment=self.segment.segment_id,
                )  # fmt: skip
            )
        self._finish()
        return 0

    def _close(self) -> None:
        # No heartbeats while the last uploads drain: stop NVRx's hang watch first (the saver's own
        # timeout bounds the wait).
        self.nvrx.close()
        if self.saver is not None:
            # ft_launcher SIGTERMs the surviving workers when it restarts them (SIGKILL after its
            # workers-stop timeout): finish the pending saves first, else the restart finds no complete
            # checkpoint of this launch and starts over.
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.saver.wait()
            self.saver.close()
        self.events.close()
        try:
            shutdown()
        except RuntimeError as e:  # a peer is gone (crash drill); nothing left to coordinate
            log.warning("process group shutdown: %s", e)
        sys.stdout.flush()
