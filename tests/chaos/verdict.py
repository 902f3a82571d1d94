"""A chaos cell passes only with its verdict line; an interrupted or incomplete cell never passes.

A cell is a test that asks for the `cell_done` fixture and calls it, once every end-state check held,
with its `CELL ...` line. Around such tests this plugin makes sure that:

- a cell whose test body returned without calling `cell_done` is reported failed (it did not check
  the end state, whatever made it return);
- a Ctrl-C (SIGINT) or SIGTERM during a cell's body fails that cell, after the test's own clean-up
  ran, and stops the session there (its teardown then puts the stack down as usual); a SIGTERM whose
  interrupt Python swallowed (it came inside a callback that cannot raise) stops the session after the
  test it came in;
- a cell interrupted where that cannot become a failure (during its setup, such as the clean reference
  run, or by a second Ctrl-C in its clean-up) is listed at the end as having no result;
- the terminal summary has a "chaos cells" section: every cell that started, its outcome, duration
  (of its body, without the setup) and verdict line.

Nothing here knows about Slurm, Airflow or the drill: tests/chaos/test_verdict.py checks it on stand-in
tests in a pytest session of their own.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import pytest

NAME = "longrun-chaos-verdicts"
FIXTURE = "cell_done"
CELL_LINE = pytest.StashKey[str]()


@pytest.fixture
def cell_done(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Call with the cell's `CELL ...` line once every end-state check held; nothing else passes it."""

    def done(line: str) -> None:
        request.node.stash[CELL_LINE] = line
        print(line, flush=True)

    return done


def is_cell(item: pytest.Item) -> bool:
    return FIXTURE in getattr(item, "fixturenames", ())


@dataclass
class Cell:
    started: float
    called: float | None = None  # when the test body began (after setup: stack, clean reference run)
    outcome: str | None = None  # None: no result (interrupted before pytest could report one)
    seconds: float | None = None
    line: str | None = None


# Signals the handler below received. Python runs a handler at the next bytecode, which can be inside a
# callback that cannot raise (a garbage-collector or weakref callback, `__del__`): the KeyboardInterrupt is
# then only reported as "Exception ignored" and the session would go on into the next cell. The record
# lets the session stop at the next report instead (seen once: SQLAlchemy's `_collection_gced`).
_RECEIVED: list[int] = []


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    _RECEIVED.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


class Verdicts:
    def __init__(self) -> None:
        self.cells: dict[str, Cell] = {}
        self._old_sigterm: Any = None
        self._sigterm_set = False

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self._sigterm_set:
            signal.signal(signal.SIGTERM, self._old_sigterm or signal.SIG_DFL)
            self._sigterm_set = False

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if not is_cell(item):
            return
        self.cells[item.nodeid] = Cell(started=time.monotonic())
        if not self._sigterm_set:
            # From the first cell on, SIGTERM (a job runner's stop, `timeout`) goes the way of Ctrl-C: the
            # cell fails visibly and the session's teardown stops the stack, instead of a silent death.
            self._old_sigterm = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
            self._sigterm_set = True

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        if not is_cell(item):
            return (yield)
        if (cell := self.cells.get(item.nodeid)) is not None:
            cell.called = time.monotonic()
        try:
            return (yield)
        except KeyboardInterrupt as e:
            item.session.shouldstop = f"interrupted in {item.nodeid}"
            pytest.fail(f"interrupted ({e or 'SIGINT'}) before the cell's verdict: no result", pytrace=False)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if _RECEIVED and not item.session.shouldstop:
            # a SIGTERM whose KeyboardInterrupt was swallowed (see _RECEIVED): stop after this test
            item.session.shouldstop = f"signal {_RECEIVED[0]} received during {item.nodeid}"
        if not is_cell(item):
            return report
        line = item.stash.get(CELL_LINE, None)
        if report.when == "call" and report.passed and line is None:
            report.outcome = "failed"
            report.longrepr = f"{item.nodeid} returned without its CELL line: the end state was not checked"
        cell = self.cells.get(item.nodeid)
        if cell is not None and (report.when == "call" or not report.passed):
            if cell.outcome is None or cell.outcome == "passed":  # a failed teardown still counts
                cell.outcome = report.outcome
            cell.seconds = time.monotonic() - (cell.called or cell.started)
            cell.line = line
        return report

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.cells:
            return
        tr = terminalreporter
        tr.section("chaos cells")
        for nodeid, cell in self.cells.items():
            outcome = (cell.outcome or "no result (interrupted)").upper()
            took = f"{cell.seconds:.0f} s" if cell.seconds is not None else "-"
            tr.write_line(f"{outcome} {nodeid} {took} {cell.line or ''}".rstrip(), red=outcome != "PASSED")


def register(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin(NAME):
        config.pluginmanager.register(Verdicts(), NAME)
