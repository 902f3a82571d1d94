"""The fault matrix's grid, without a stack: every (step, component) of the harness is a cell, once, the
proven cells first, every step recognisable, and each cell selectable
alone by its id (`make test-chaos PYTEST_ARGS='-k <step>-<component>'`)."""

from __future__ import annotations

import itertools

from . import grid, harness, test_matrix


def test_every_combination_is_a_cell_once() -> None:
    assert len(test_matrix.CELLS) == len(set(test_matrix.CELLS))
    assert set(test_matrix.CELLS) == set(itertools.product(grid.STEPS, grid.COMPONENTS)) == set(grid.GRID)
    assert len(test_matrix.CELLS) == 70


def test_proven_cells_first() -> None:
    assert test_matrix.CELLS[: len(test_matrix.PROVEN)] == test_matrix.PROVEN


def test_every_step_is_recognised() -> None:
    steps = (*grid.STEPS, *grid.SPARE_STEPS, *grid.SPARE_LATER)
    assert set(harness.REACHED) == set(steps)
    assert set(harness.STEP_TASK) <= set(steps)


def test_later_steps_come_later() -> None:
    # grid.NEXT names, for every step, steps recognised by the harness that come after it in the drill
    # (the hot-spare row in a drill of its own, after the 70's steps here).
    order = (*grid.STEPS, *grid.SPARE_STEPS, *grid.SPARE_LATER)
    assert set(grid.NEXT) == set(order)
    for step, later in grid.NEXT.items():
        assert all(order.index(s) > order.index(step) for s in later), (step, later)


def test_the_hot_spare_row_is_one_step_by_every_component() -> None:
    assert test_matrix.SPARE_CELLS == [(s, c) for s in grid.SPARE_STEPS for c in grid.COMPONENTS]
    assert not set(test_matrix.SPARE_CELLS) & set(test_matrix.CELLS)


def test_expected_failures_are_cells_with_a_runbook() -> None:
    for cell, why in test_matrix.EXPECTED_FAIL.items():
        assert cell in test_matrix.CELLS, cell
        assert "runbooks/" in why, (cell, why)


def test_one_cell_selectable_by_id() -> None:
    # Selection as `-k` does it: an id must not match another cell's id (e.g. "drain-s" in "drain-slurmd").
    ids = [f"{s}-{c}" for s, c in [*test_matrix.CELLS, *test_matrix.SPARE_CELLS]]
    for i in ids:
        assert [j for j in ids if i in j] == [i], i
