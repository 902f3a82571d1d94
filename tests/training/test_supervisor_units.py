"""The supervisor's choices without Slurm: which nodes the first attempt uses, the bounded wait, and the
directive it follows. The step is a real bash script; the allocation is given (Slurm's part is tested in
tests/slurm/test_supervisor.py)."""

from __future__ import annotations

import time

from training.directive import Directive
from training.schema import EXIT_SDC_VERDICT, store_key
from training.store import LocalDirStore, put_json
from training.supervisor import Supervisor


def _sup(tmp_path, held, *, step, include=(), wait_s=5.0) -> Supervisor:
    return Supervisor(run="su", job_id="5", width=3, spares=1, wait_s=wait_s, poll_s=0.05, step=step,
                      store=LocalDirStore(tmp_path / "store"), include=include, nodes_now=lambda: list(held))  # fmt: skip


def test_the_first_attempt_uses_the_drill_node(tmp_path):
    out = tmp_path / "nodes"
    held = ["n1", "n2", "n3", "n4"]
    assert _sup(tmp_path, held, step=f"echo $LONGRUN_STEP_NODES > {out}", include=("n4",))() == 0
    assert out.read_text().strip() == "n1,n2,n4"
    assert _sup(tmp_path, held, step=f"echo $LONGRUN_STEP_NODES > {out}")() == 0
    assert out.read_text().strip() == "n1,n2,n3"


def test_the_wait_is_bounded_and_a_directive_is_followed(tmp_path, capsys):
    log = tmp_path / "log"
    step = f'echo "$LONGRUN_ATTEMPT $LONGRUN_STEP_NODES $LONGRUN_RESUME_FROM" >> {log}; [ "$LONGRUN_ATTEMPT" != 0 ]'
    step += f" || exit {EXIT_SDC_VERDICT}"
    t0 = time.monotonic()
    assert _sup(tmp_path, ["n1", "n2", "n3", "n4"], step=step, wait_s=0.5)() == EXIT_SDC_VERDICT
    # It waited (a lower bound: sleeps only lengthen on a loaded machine), then gave up because the wait
    # ran out, not for another reason. An unbounded wait never returns: pytest-timeout fails it.
    assert time.monotonic() - t0 >= 0.5
    assert "no directive in time: exit 93" in capsys.readouterr().out
    d = Directive(run="su", job_id="5", attempt=1, nodes=("n4", "n1", "n3"), resume_from="runs/su/checkpoints/step-00000010/",
                  incident_id="i", exclude=("n2",), issued_at=time.time())  # fmt: skip
    put_json(LocalDirStore(tmp_path / "store"), store_key("su", d.relative_path), d.to_json())
    log.unlink()
    assert _sup(tmp_path, ["n1", "n3", "n4"], step=step)() == 0
    assert log.read_text().splitlines() == ["0 n1,n3,n4 ", "1 n1,n3,n4 runs/su/checkpoints/step-00000010/"]
