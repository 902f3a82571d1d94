"""JobSpec and JobTag validation: the corpus of inputs that must never reach sbatch."""

from __future__ import annotations

import pytest
from longrun.slurm.errors import InvalidSpecError, TerminalSlurmError
from longrun.slurm.spec import JobSpec, JobTag

BASE = dict(name="train", partition="debug", command=["echo ok"], comment="longrun/d/r/t/-1/1")


def spec(**kw):
    return JobSpec(**{**BASE, **kw})


def test_defaults_are_the_h100_shape():
    s = spec()
    assert (s.gpus_per_node, s.gpu_type, s.exclusive, s.requeue) == (8, "h100", True, True)
    assert s.command == ("echo ok",)


def test_lists_become_tuples_and_round_trip():
    s = spec(exclude=["n2"], nodelist=["n1"], nodes=2, env={"A": "1"})
    assert s.exclude == ("n2",) and s.nodelist == ("n1",)
    assert JobSpec.from_dict(s.to_dict()) == s


# (field, bad value, fragment of the message). The message must name the field.
BAD = [
    ("name", "--wrap=rm -rf /", "must be"),
    ("name", "-x", "must be"),
    ("name", "a;b", "must be"),
    ("name", "a b", "must be"),
    ("name", "a\nb", "must be"),
    ("name", "$(id)", "must be"),
    ("name", "`id`", "must be"),
    ("name", "", "must be"),
    ("name", "x" * 65, "must be"),
    ("name", 5, "string"),
    ("partition", "debug,gpu", "must be"),
    ("partition", "--partition=x", "must be"),
    ("comment", "--wrap=sh", "option injection"),
    ("comment", "tag with space", "must be"),
    ("comment", "a'b", "must be"),
    ("comment", 'a"b', "must be"),
    ("comment", "a\nb", "must be"),
    ("nodes", 0, "between"),
    ("nodes", 10**9, "between"),
    ("nodes", -1, "between"),
    ("nodes", True, "integer"),
    ("nodes", "3", "integer"),
    ("ntasks_per_node", 100_000, "between"),
    ("gpus_per_node", -1, "between"),
    ("gpus_per_node", 1000, "between"),
    ("gpu_type", "h100:8", "gres type"),
    ("gpu_type", "H100;rm", "gres type"),
    ("time_limit_min", 0, "between"),
    ("time_limit_min", 10**7, "between"),
    ("exclude", "n2", "not one string"),
    ("exclude", ["n2", "n2"], "twice"),
    ("exclude", ["n[1-3]"], "node name"),
    ("exclude", ["-n2"], "node name"),
    ("exclude", ["n2 n3"], "node name"),
    ("nodelist", ["n1", "n2"], "more nodes"),
    ("reservation", "--x", "must be"),
    ("reservation", "r;s", "must be"),
    ("workdir", "relative/dir", "absolute"),
    ("workdir", "/tmp/../etc", "traversal"),
    ("workdir", "/tmp/a b", "path of"),
    ("workdir", "/tmp/$HOME", "path of"),
    ("workdir", "-/x", "option injection"),
    ("output", "../../etc/passwd", "traversal"),
    ("output", "/tmp/x;rm", "path of"),
    ("output", "--output=/x", "option injection"),
    ("env", {"A B": "1"}, "environment variable name"),
    ("env", {"1A": "1"}, "environment variable name"),
    ("env", {"A": "$(id)"}, "printable"),
    ("env", {"A": "x`id`"}, "printable"),
    ("env", {"A": "x;y"}, "printable"),
    ("env", {"A": "x\ny"}, "printable"),
    ("env", {"A": "it's"}, "printable"),
    ("env", {"A": "x" * 5000}, "printable"),
    ("env", ["A=1"], "mapping"),
    ("command", "echo hi", "list of script lines"),
    ("command", [], "1-256 lines"),
    ("command", ["echo a\necho b"], "one line"),
    ("command", ["echo a\rb"], "one line"),
    ("command", ["echo \0"], "one line"),
    ("command", ["#SBATCH --wrap=id"], "#SBATCH"),
    ("command", ["  #sbatch --nodes=99"], "#SBATCH"),
    ("command", ["x" * 5000], "longer than"),
    ("command", ["echo"] * 300, "1-256 lines"),
    ("requeue", "yes", "True or False"),
    ("exclusive", 1, "True or False"),
]


@pytest.mark.parametrize(("field", "value", "why"), BAD, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(BAD)])
def test_bad_input_is_refused_naming_the_field(field, value, why):
    kw = {field: value}
    if field == "nodelist":
        kw["nodes"] = 1
    with pytest.raises(InvalidSpecError) as info:
        spec(**kw)
    assert str(info.value).startswith(field), info.value
    assert why in str(info.value)
    assert isinstance(info.value, TerminalSlurmError) and isinstance(info.value, ValueError)


def test_exclude_and_nodelist_must_not_overlap():
    with pytest.raises(InvalidSpecError, match="^exclude.*also in nodelist"):
        spec(nodes=2, nodelist=["n1"], exclude=["n1"])


def test_unknown_fields_are_refused():
    with pytest.raises(InvalidSpecError, match="unknown field"):
        JobSpec.from_dict({**BASE, "wrap": "id"})


def test_tag_round_trip_and_prefix():
    t = JobTag(
        dag_id="training_run", run_id="manual__2026-11-29T15:34:14.1+00:00", task_id="submit", try_number=3
    )
    assert t.render() == "longrun/training_run/manual__2026-11-29T15:34:14.1+00:00/submit/-1/3"
    assert JobTag.parse(t.render()) == t
    assert t.render().startswith(t.prefix())
    assert (
        JobTag(dag_id="training_run", run_id=t.run_id, task_id="submit", try_number=1).prefix() == t.prefix()
    )


@pytest.mark.parametrize(
    "text", ["", "other/x", "longrun/a/b/c/d/e", "longrun/a/b/c/-1", "longrun/a b/r/t/-1/1"]
)
def test_foreign_comments_are_not_tags(text):
    assert JobTag.parse(text) is None


@pytest.mark.parametrize(
    ("field", "value"), [("dag_id", "a/b"), ("run_id", "r;x"), ("task_id", "-t"), ("try_number", -1)]
)
def test_bad_tag_parts(field, value):
    kw = dict(dag_id="d", run_id="r", task_id="t", try_number=1)
    with pytest.raises(InvalidSpecError, match=f"^{field}"):
        JobTag(**{**kw, field: value})
