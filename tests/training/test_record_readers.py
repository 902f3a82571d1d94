"""The shared field readers of the typed records (`training.records.base`). Pure Python."""

from __future__ import annotations

import pytest

from training.records.base import opt_objects
from training.schema import SchemaError


def test_opt_objects_reads_a_list_of_objects_as_written() -> None:
    rounds = [{"round": 1, "verdict": "pass"}, {"round": 2, "reason": None}]
    assert opt_objects("k", {"rounds": rounds}, "rounds") == tuple(rounds)
    assert opt_objects("k", {"rounds": []}, "rounds") == ()
    assert opt_objects("k", {"rounds": None}, "rounds") == ()
    assert opt_objects("k", {}, "rounds") == ()


@pytest.mark.parametrize("value", ["pass", {"round": 1}, ["pass"], [{"round": 1}, 3], 0, ""])
def test_opt_objects_refuses_anything_else_naming_the_field(value: object) -> None:
    with pytest.raises(SchemaError, match="k record field 'rounds' .* is not a list of objects"):
        opt_objects("k", {"rounds": value}, "rounds")


def test_a_record_leaves_out_a_part_that_is_empty_and_nothing_else_that_writes_itself() -> None:
    from training.records.base import _empty
    from training.records.incident import Attribution
    from training.records.job import World

    assert _empty(Attribution()) and _empty(Attribution.from_json({}))
    assert not _empty(Attribution(node="n2"))
    assert not _empty(Attribution.from_json({"node": None}))  # a null the writer set is kept
    assert not _empty(World())  # writes its own JSON but is no part: always written
    assert _empty(None) and _empty(()) and _empty({}) and not _empty(0)
