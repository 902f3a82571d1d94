"""longrun's public job-side API: put the three SDC checks, checkpoints with manifests, the records and the
verdict sequence around your own training loop (docs/adopting.md).

    from training.api import Guard, GuardConfig

    guard = Guard(GuardConfig.from_env(grad_clip=1.0))
    ddp = guard.prepare(model, optimizer, loss_fn=loss_fn, scheduler=scheduler, state={"data": loader})
    sys.exit(guard.run(loader))

Imports no Airflow and nothing of the orchestrator (`longrun`).
"""

from training.api.guard import Guard, SetupError, StepOutcome
from training.api.state import StateError, Stateful
from training.checks.base import CheckResult
from training.config import CheckConfig, GuardConfig
from training.faults import Fault, parse_fault

__all__ = [
    "CheckConfig",
    "CheckResult",
    "Fault",
    "Guard",
    "GuardConfig",
    "SetupError",
    "StateError",
    "StepOutcome",
    "Stateful",
    "parse_fault",
]
