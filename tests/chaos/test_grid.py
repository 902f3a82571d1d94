"""The fault matrix's grid, without a stack: every (step, component) of the harness is a cell, once, the
proven cells first, every step recognisable, and each cell selectable
alone by its id (`make test-chaos PYTEST_ARGS='-k <step>-<component>'`)."""

from __future__ import annotations

import itertools

from . import harness, test_matrix


def test_every_combination_is_a_cell_once() -> None:
    assert len(test_matrix.CELLS) == len(set(test_matrix.CELLS))
    assert set(test_matrix.CELLS) == set(itertools.product(harness.STEPS, harness.COMPONENTS))
    assert len(test_matrix.CELLS) == 70


def test_proven_cells_first() -> None:
    assert test_matrix.CELLS[: len(test_matrix.PROVEN)] == test_matrix.PROVEN


def test_every_step_is_recognised() -> None:
    assert set(harness.REACHED) == set(harness.STEPS)
    assert set(harness.STEP_TASK) <= set(harness.STEPS)


def test_expected_failures_are_cells_with_a_runbook() -> None:
    for cell, why in test_matrix.EXPECTED_FAIL.items():
        assert cell in test_matrix.CELLS, cell
        assert "runbooks/" in why, (cell, why)


def test_one_cell_selectable_by_id() -> None:
    # Selection as `-k` does it: an id must not match another cell's id (e.g. "drain-s" in "drain-slurmd").
    ids = [f"{s}-{c}" for s, c in test_matrix.CELLS]
    for i in ids:
        assert [j for j in ids if i in j] == [i], i
