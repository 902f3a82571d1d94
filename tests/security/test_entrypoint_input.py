"""Hostile entrypoints, arguments and interpreters, refused before anything reaches Slurm (longrun.entrypoint
through RunSpec, and through `spec_from_params`, what the Airflow tasks run). Pure unit tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from longrun import entrypoint as ep
from longrun.monitor import lifecycle
from longrun.runspec import RunSpec, RunSpecError


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site whose scripts live in <tmp>/entrypoints (which exists, with one script) and that allows one
    extra job interpreter."""
    root = tmp_path / "entrypoints"
    (root / "team").mkdir(parents=True)
    (root / "team" / "train.py").write_text("print('hi')\n")
    monkeypatch.setenv(ep.ENTRYPOINT_DIR_ENV, str(root))
    monkeypatch.setenv(ep.JOB_PYTHONS_ENV, "/opt/job-venv/bin/python:/opt/other/bin/python3")
    return root


def _refused(field: str, **kw: object) -> RunSpecError:
    with pytest.raises(RunSpecError) as e:
        RunSpec(run_name="r1", gpus_per_node=0, **kw)  # type: ignore[arg-type]
    assert e.value.field == field and str(e.value).startswith(f"{field}=")
    return e.value


def test_the_defaults_are_the_reference_trainer(site: Path) -> None:
    spec = RunSpec(run_name="r1")
    assert (spec.entrypoint, spec.entrypoint_args, spec.job_python) == ("module:training.train", (), "")
    assert spec.is_reference


@pytest.mark.parametrize(
    "entrypoint",
    ["module:a;rm -rf /", "module:$(x)", "module:a b", "module:", "module:a..b", "module:.a", "module:a.",
     "module:1abc", "module:a-b", "module:`id`", "training.train", "exec:/bin/sh", "", "module:a\nb"],
)  # fmt: skip
def test_a_module_name_with_shell_characters_is_refused(site: Path, entrypoint: str) -> None:
    err = _refused("entrypoint", entrypoint=entrypoint)
    assert repr(entrypoint) in str(err)


def test_a_script_inside_the_site_directory_is_accepted(site: Path) -> None:
    spec = RunSpec(run_name="r1", entrypoint=f"script:{site}/team/train.py", entrypoint_args=["--lr", "1e-3"])
    assert spec.entrypoint_args == ("--lr", "1e-3") and not spec.is_reference
    # one not there yet (the Airflow worker may not see the cluster's filesystem) is checked by its path
    RunSpec(run_name="r1", entrypoint=f"script:{site}/team/later.py")


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/etc/passwd", "not inside"),
        ("{root}/../escape.py", "absolute, normalized"),
        ("{root}/team/../../escape.py", "absolute, normalized"),
        ("{root}/./team/train.py", "absolute, normalized"),
        ("{root}//team/train.py", "absolute, normalized"),
        ("{root}/team/", "absolute, normalized"),
        ("relative/train.py", "absolute, normalized"),
        ("{root}/team/my train.py", "absolute, normalized"),
        ("{root}/team/$(id).py", "absolute, normalized"),
        ("{root}/team/a;b.py", "absolute, normalized"),
        ("{root}", "not inside"),
        ("{root}-other/train.py", "not inside"),
        ("{root}/team", "is a directory"),
    ],
)
def test_a_script_outside_the_site_directory_is_refused(site: Path, path: str, why: str) -> None:
    err = _refused("entrypoint", entrypoint="script:" + path.format(root=site))
    assert why in str(err)


def test_a_symlink_out_of_the_site_directory_is_refused(site: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "evil.py").write_text("import os\n")
    os.symlink(outside / "evil.py", site / "team" / "link.py")  # the script is a link
    os.symlink(outside, site / "dirlink")  # a directory on the way is a link
    for path in (site / "team" / "link.py", site / "dirlink" / "evil.py", site / "dirlink" / "not-yet.py"):
        err = _refused("entrypoint", entrypoint=f"script:{path}")
        assert "resolves to" in str(err) and "outside" in str(err)
    os.symlink(site / "team" / "train.py", site / "inside.py")  # a link that stays inside is fine
    RunSpec(run_name="r1", entrypoint=f"script:{site}/inside.py")


def test_without_the_site_directory_no_script_is_launched(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ep.ENTRYPOINT_DIR_ENV)
    err = _refused("entrypoint", entrypoint=f"script:{site}/team/train.py")
    assert "LONGRUN_ENTRYPOINT_DIR" in str(err) and "set" in str(err)
    monkeypatch.setenv(ep.ENTRYPOINT_DIR_ENV, "relative/dir")
    assert "not a normalized absolute directory" in str(_refused("entrypoint", entrypoint="script:/x/t.py"))


@pytest.mark.parametrize(
    ("args", "field", "why"),
    [
        ("--lr 1e-3", "entrypoint_args", "never a shell string"),
        (["ok", "two\nlines"], "entrypoint_args[1]", "newline"),
        (["carriage\rreturn"], "entrypoint_args[0]", "newline"),
        (["nul\x00byte"], "entrypoint_args[0]", "NUL"),
        (["x" * (ep.MAX_ARG_CHARS + 1)], "entrypoint_args[0]", "longer than"),
        (["a"] * (ep.MAX_ARGS + 1), "entrypoint_args", f"at most {ep.MAX_ARGS}"),
        ([1, 2], "entrypoint_args[0]", "must be a string"),
        ({"a": 1}, "entrypoint_args", "list of strings"),
    ],
)
def test_bad_arguments_are_refused(site: Path, args: object, field: str, why: str) -> None:
    assert why in str(_refused(field, entrypoint_args=args))


def test_arguments_at_the_limits_are_accepted(site: Path) -> None:
    args = ["x" * ep.MAX_ARG_CHARS] + ["$(rm -rf /)"] * (ep.MAX_ARGS - 1)
    assert len(RunSpec(run_name="r1", entrypoint_args=args).entrypoint_args) == ep.MAX_ARGS


@pytest.mark.parametrize(
    ("python", "why"),
    [
        ("/usr/bin/python3", "is not one of the site's LONGRUN_JOB_PYTHONS"),
        ("/opt/job-venv/bin/../../../bin/sh", "absolute, normalized"),
        ("python3", "absolute, normalized"),
        ("/opt/job-venv/bin/python; id", "absolute, normalized"),
    ],
)
def test_a_job_python_not_in_the_allow_list_is_refused(site: Path, python: str, why: str) -> None:
    assert why in str(_refused("job_python", job_python=python))


def test_without_the_allow_list_only_the_default_interpreter(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    RunSpec(run_name="r1", job_python="/opt/job-venv/bin/python")
    monkeypatch.delenv(ep.JOB_PYTHONS_ENV)
    assert "LONGRUN_JOB_PYTHONS" in str(_refused("job_python", job_python="/opt/job-venv/bin/python"))
    RunSpec(run_name="r1", job_python="")


def test_model_presets_bind_only_the_reference_trainer(site: Path) -> None:
    _refused("model", model="gpt-9")
    assert RunSpec(run_name="r1", model="gpt-9", entrypoint="module:my_pkg.train").model == "gpt-9"


def test_the_job_settings_cannot_be_smuggled_in_through_extra_env(site: Path) -> None:
    assert "LONGRUN_FAULTS" in str(_refused("extra_env", extra_env={"LONGRUN_FAULTS": "nan:1:0"}))


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("entrypoint", "module:a;rm -rf /", "dotted Python module name"),
        ("entrypoint", "script:/etc/passwd", "not inside"),
        ("entrypoint", "script:{root}/../x.py", "absolute, normalized"),
        ("entrypoint_args", ["a\nb"], "newline"),
        ("entrypoint_args", "--lr 1", "never a shell string"),
        ("job_python", "/bin/sh", "LONGRUN_JOB_PYTHONS"),
    ],
)
def test_the_airflow_task_refuses_them_by_field(site: Path, key: str, value: object, why: str) -> None:
    if isinstance(value, str):
        value = value.format(root=site)
    with pytest.raises(RunSpecError) as e:
        lifecycle.spec_from_params({"run_name": "r1", key: value})
    assert e.value.field.split("[")[0] == key and str(e.value).startswith(key) and why in str(e.value)


def test_params_round_trip_and_a_relaunch_keeps_the_entrypoint(site: Path) -> None:
    params = {
        "run_name": "r1",
        "entrypoint": f"script:{site}/team/train.py",
        "entrypoint_args": ["--data", "/d/my corpus", "$(x)"],
        "job_python": "/opt/job-venv/bin/python",
        "model": "not-a-preset",
    }
    spec = lifecycle.spec_from_params(params)
    conf = lifecycle.conf_of(spec)
    assert {k: conf[k] for k in params} == params
    again = spec.relaunch(resume_from="runs/r1/checkpoints/step-00000010/", exclude=("n2",))
    back = lifecycle.spec_from_params(lifecycle.conf_of(again))
    assert (back.entrypoint, back.entrypoint_args, back.job_python) == (
        spec.entrypoint,
        spec.entrypoint_args,
        spec.job_python,
    )
    assert back.attempt == 1 and back.resume_from == "runs/r1/checkpoints/step-00000010/"
    assert lifecycle.spec_from_params({"run_name": "r1", "job_python": None}).job_python == ""


def test_the_form_patterns_agree_with_the_checks(site: Path) -> None:
    """What the Params form's JSON schema patterns let through, RunSpec checks; what they refuse, it refuses."""
    import re

    pattern = re.compile(ep.ENTRYPOINT_PATTERN)
    for good in ("module:training.train", "module:a_b.c2", f"script:{site}/team/train.py"):
        assert pattern.search(good), good
    for bad in ("module:a;b", "module:a b", "script:/a/../b.py", "script:a.py", "script:/a//b", "script:/a/"):
        assert not pattern.search(bad), bad
    assert re.search(ep.JOB_PYTHON_PATTERN, "") and re.search(ep.JOB_PYTHON_PATTERN, "/opt/v/bin/python")
    assert not re.search(ep.JOB_PYTHON_PATTERN, "python") and not re.search(ep.JOB_PYTHON_PATTERN, "/a/../b")
    assert not re.search(ep.ARG_PATTERN, "a\nb") and not re.search(ep.ARG_PATTERN, "a\x00b")
    assert re.search(ep.ARG_PATTERN, "$(x) 'y' \"z\"")
