"""The runbooks are tested like code: required headings, links that resolve, and every command shown in a
fenced code block is one this project really has (the program exists; `longrun ...`, `python -m ...` and
`airflow ...` subcommands are accepted by their argparse and know every `--option` shown)."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from longrun.runbooks import ALIASES, BASE_URL_ENV, RUNBOOKS, runbook_path, runbook_url

REPO = Path(__file__).resolve().parents[2]
RUNBOOK_DIR = REPO / "runbooks"
VENV_BIN = Path(sys.executable).parent

HEADINGS = ("Meaning", "Impact", "Diagnosis", "Mitigation", "Verification", "Escalation")
EXPECTED = (
    "finite-check-alert",
    "recompute-mismatch",
    "weight-vote-divergence",
    "ambiguous-evidence",
    "diagnostic-failed",
    "diagnostic-passed",
    "stale-heartbeat",
    "job-held-after-failed-launch",
    "checkpoint-validation-failed",
    "audit-failed",
    "relaunch-failed",
    "node-return",
    "repeat-offender",
    "security-event",
    "run-a-drill",
    "dag-paused",
    "node-drained-by-someone-else",
    "scheduler-restart-stall",
)
# Shell builtins a runbook may start a line with; the commands they run are checked on their own.
BUILTINS = {"eval", "export", "cd", "source"}
FENCE = re.compile(r"^\s*```(\w*)\s*$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PLACEHOLDER = re.compile(r"<[A-Za-z][A-Za-z0-9_-]*>")
SUBSTITUTION = re.compile(r"\$\(([^()]*)\)")
SEPARATORS = {"|", "||", "&&", ";", "&"}


def runbook_files() -> list[Path]:
    return sorted(RUNBOOK_DIR.glob("*.md"))


def procedure_files() -> list[Path]:
    return [p for p in runbook_files() if p.name != "README.md"]


def code_blocks(text: str) -> list[str]:
    """The contents of fenced code blocks in shell (or unnamed) languages."""
    blocks, current, lang = [], None, ""
    for line in text.splitlines():
        m = FENCE.match(line)
        if m and current is None:
            current, lang = [], m.group(1)
        elif m and current is not None:
            if lang in ("", "bash", "sh", "shell", "console"):
                blocks.append("\n".join(current))
            current = None
        elif current is not None:
            current.append(line)
    assert current is None, "unclosed code fence"
    return blocks


def command_lines(block: str) -> list[str]:
    """Logical lines (continuations joined), without comments and blank lines."""
    lines, pending = [], ""
    for raw in block.splitlines():
        line = raw.strip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def simple_commands(line: str) -> list[list[str]]:
    """argv of every simple command in `line`: each side of a pipe or `&&`, and each `$(...)`."""
    line = PLACEHOLDER.sub("PLACEHOLDER", line)
    inner = SUBSTITUTION.findall(line)
    line = SUBSTITUTION.sub("SUBSTITUTED", line)
    out: list[list[str]] = []
    for text in [line, *inner]:
        lexer = shlex.shlex(text, posix=True, punctuation_chars="|&;")
        lexer.whitespace_split = True
        argv: list[str] = []
        for tok in lexer:
            if tok in SEPARATORS:
                if argv:
                    out.append(argv)
                argv = []
            else:
                argv.append(tok)
        if argv:
            out.append(argv)
    # Leading VAR=value assignments are not the program.
    return [[t for i, t in enumerate(a) if not re.match(r"^\w+=", t) or i > _first_word(a)] for a in out]


def _first_word(argv: list[str]) -> int:
    for i, t in enumerate(argv):
        if not re.match(r"^\w+=", t):
            return i
    return len(argv)


def all_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in runbook_files():
        for block in code_blocks(path.read_text()):
            for line in command_lines(block):
                for argv in simple_commands(line):
                    found.append((path.name, argv))
    return found


def options(argv: list[str]) -> list[str]:
    """The --options an argv passes (without values)."""
    return [a.split("=", 1)[0] for a in argv if a.startswith("--")]


@functools.cache
def help_text(*argv: str) -> str:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    if argv[0] == str(VENV_BIN / "airflow"):
        # A throwaway home: asking Airflow for --help must not create ~/airflow or touch a real one.
        env["AIRFLOW_HOME"] = str(_airflow_home())
        env.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    out = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, f"`{' '.join(argv)} --help` exited {out.returncode}: {out.stderr[-2000:]}"
    return out.stdout + out.stderr


@functools.cache
def _airflow_home() -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix="longrun-runbook-airflow-"))


# ---- structure -----------------------------------------------------------------------------------------


def test_every_expected_runbook_exists_and_no_stray_ones() -> None:
    names = {p.stem for p in procedure_files()}
    assert names == set(EXPECTED)
    assert (RUNBOOK_DIR / "README.md").is_file()


@pytest.mark.parametrize("name", EXPECTED)
def test_runbook_has_the_required_headings_in_order(name: str) -> None:
    text = (RUNBOOK_DIR / f"{name}.md").read_text()
    assert text.startswith("# "), f"{name}.md must start with a '# ' title"
    found = re.findall(r"^## (.+?)\s*$", text, flags=re.M)
    assert found == list(HEADINGS), f"{name}.md headings {found}; expected {list(HEADINGS)}"
    diagnosis = text.split("## Diagnosis", 1)[1].split("## Mitigation", 1)[0]
    assert re.search(r"^1\. ", diagnosis, flags=re.M), f"{name}.md: Diagnosis needs numbered steps"
    assert "```" in diagnosis, f"{name}.md: Diagnosis needs commands to paste"


def test_readme_indexes_every_runbook() -> None:
    readme = (RUNBOOK_DIR / "README.md").read_text()
    linked = {t for t in LINK.findall(readme)}
    assert {f"{n}.md" for n in EXPECTED} <= linked


@pytest.mark.parametrize("path", runbook_files(), ids=lambda p: p.name)
def test_relative_links_resolve(path: Path) -> None:
    for target in LINK.findall(path.read_text()):
        if re.match(r"^(https?|mailto):", target) or target.startswith("#"):
            continue
        resolved = (path.parent / target.split("#", 1)[0]).resolve()
        assert resolved.exists(), f"{path.name}: link {target!r} does not resolve ({resolved})"


# ---- commands ------------------------------------------------------------------------------------------


def test_runbooks_show_commands() -> None:
    assert len(all_commands()) > 50


@pytest.mark.parametrize("program", sorted({argv[0] for _f, argv in all_commands()}))
def test_every_program_exists(program: str) -> None:
    path = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    assert program in BUILTINS or shutil.which(program, path=path), (
        f"runbooks use `{program}`, which is neither a shell builtin nor on PATH (venv first)"
    )


def _longrun_cases() -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    cases: dict[tuple[str, ...], set[str]] = {}
    for _f, argv in all_commands():
        if argv[0] != "longrun":
            continue
        sub = []
        for tok in argv[1:]:
            if tok.startswith("-") or tok in ("PLACEHOLDER", "SUBSTITUTED"):
                break
            sub.append(tok)
        cases.setdefault(tuple(sub), set()).update(options(argv))
    return sorted((k, tuple(sorted(v))) for k, v in cases.items())


@pytest.mark.parametrize(("sub", "opts"), _longrun_cases(), ids=lambda v: " ".join(v) or "-")
def test_longrun_subcommands_and_options_exist(sub: tuple[str, ...], opts: tuple[str, ...]) -> None:
    assert sub, "a runbook shows `longrun` without a subcommand"
    text = help_text(str(VENV_BIN / "longrun"), *sub)
    for opt in opts:
        assert opt in text, f"`longrun {' '.join(sub)}` has no option {opt}:\n{text}"


def _python_module_cases() -> list[tuple[str, tuple[str, ...]]]:
    cases: dict[str, set[str]] = {}
    for _f, argv in all_commands():
        for i, tok in enumerate(argv[:-1]):
            if tok == "-m" and i > 0 and Path(argv[i - 1]).name.startswith("python"):
                cases.setdefault(argv[i + 1], set()).update(options(argv[i + 2 :]))
    return sorted((k, tuple(sorted(v))) for k, v in cases.items())


@pytest.mark.parametrize(("module", "opts"), _python_module_cases(), ids=lambda v: str(v))
def test_python_modules_and_options_exist(module: str, opts: tuple[str, ...]) -> None:
    assert importlib.util.find_spec(module) is not None, (
        f"runbooks run `python -m {module}`, which does not exist"
    )
    text = help_text(sys.executable, "-m", module)
    for opt in opts:
        assert opt in text, f"`python -m {module}` has no option {opt}:\n{text}"


def _airflow_cases() -> list[tuple[tuple[str, str], tuple[str, ...]]]:
    cases: dict[tuple[str, str], set[str]] = {}
    for _f, argv in all_commands():
        if argv[0] == "airflow":
            assert len(argv) >= 3, f"`{' '.join(argv)}`: expected `airflow GROUP COMMAND ...`"
            short = {a for a in argv[3:] if re.match(r"^-\w$", a)}
            cases.setdefault((argv[1], argv[2]), set()).update(options(argv) + sorted(short))
    return sorted((k, tuple(sorted(v))) for k, v in cases.items())


@pytest.mark.parametrize(("sub", "opts"), _airflow_cases(), ids=lambda v: " ".join(v))
def test_airflow_commands_and_options_exist(sub: tuple[str, str], opts: tuple[str, ...]) -> None:
    text = help_text(str(VENV_BIN / "airflow"), *sub)
    for opt in opts:
        assert opt in text, f"`airflow {' '.join(sub)}` has no option {opt}:\n{text[-2000:]}"


def test_dags_named_in_runbooks_exist() -> None:
    """`airflow dags ... <dag_id>` must name one of the project's DAG ids (in dags/)."""
    dag_ids = set(
        re.findall(r'dag_id="([^"]+)"', "".join(p.read_text() for p in (REPO / "dags").glob("*.py")))
    )
    # sdc_incident is a public DAG id (docs/contracts.md) even before its file lands.
    known = dag_ids | {"training_run", "sdc_incident", "checkpoint_audit"}
    for _f, argv in all_commands():
        if argv[:2] == ["airflow", "dags"] and len(argv) > 3 and not argv[3].startswith("-"):
            assert argv[3] in known, f"`{' '.join(argv)}` names an unknown DAG"


# ---- the mapping alerts and incidents link with ----------------------------------------------------------


def test_every_runbooks_entry_exists_and_every_runbook_is_mapped() -> None:
    for kind, path in RUNBOOKS.items():
        assert (REPO / path).is_file(), f"RUNBOOKS[{kind!r}] = {path!r} does not exist"
    mapped = {Path(p).stem for p in RUNBOOKS.values()}
    assert set(EXPECTED) <= mapped
    for alias, target in ALIASES.items():
        assert target in RUNBOOKS, f"ALIASES[{alias!r}] = {target!r} is not a RUNBOOKS key"


def test_alert_checks_have_runbooks() -> None:
    from training.records.schema import CHECKS

    for check in CHECKS:
        assert runbook_path(check).startswith("runbooks/")


def test_runbook_url_uses_the_base_url() -> None:
    assert runbook_url("audit_failed", env={}) == "runbooks/audit-failed.md"
    env = {BASE_URL_ENV: "https://git.example.org/longrun/blob/main/"}
    assert (
        runbook_url("hang", env=env)
        == "https://git.example.org/longrun/blob/main/runbooks/stale-heartbeat.md"
    )
    with pytest.raises(KeyError, match="no runbook for kind 'nope'"):
        runbook_path("nope")


# Records every store-reading command may find: one per `longrun records --kind`, for run `demo`; a
# placeholder in a key becomes `demo`, a bare `<key>` the alert's key.
SEEDED = {
    "runs/demo/alerts/demo.json": b'{"kind": "alerts"}',
    "runs/demo/checks/00000001-00000001-r000.jsonl": b'{"kind": "checks"}\n',
    "runs/demo/incidents/demo.json": b'{"kind": "incidents"}',
    "runs/demo/validations/demo.json": b'{"kind": "validations"}',
    "runs/demo/suspect/demo.json": b'{"kind": "suspect"}',
    "runs/demo/security-events/demo.json": b'{"kind": "security_event"}',
    "runs/demo/promoted/current.json": b'{"kind": "promotions"}',
    "runs/demo/checkpoints/step-00000001/manifest.json": b'{"kind": "checkpoints"}',
    "runs/demo/progress/latest.json": b'{"kind": "progress"}',
    "runs/demo/report.json": b'{"kind": "report"}',
    "audit/demo/summary.json": b'{"kind": "audit"}',
}


def _fill(argv: tuple[str, ...]) -> list[str]:
    """Placeholders filled in: a bare key is the alert's key; any other placeholder (a run name, an id in
    a key) is `demo`."""
    out = []
    for prev, arg in zip(("", *argv[:-1]), argv, strict=True):
        if arg == "PLACEHOLDER" and prev != "--run":
            arg = "runs/demo/alerts/demo.json"
        out.append(arg.replace("PLACEHOLDER", "demo"))
    return out


def _store_cases() -> list[tuple[str, ...]]:
    """Every runbook command that reads the store: `longrun records ...` and any `python -c` one-liner."""
    cases = set()
    for _f, argv in all_commands():
        if argv[:2] == ["longrun", "records"]:
            cases.add(tuple(argv))
        elif Path(argv[0]).name.startswith("python") and len(argv) > 2 and argv[1] == "-c":
            cases.add((sys.executable, *argv[1:]))
    return sorted(cases)


def test_runbooks_read_records_with_longrun_records() -> None:
    assert sum(argv[:2] == ("longrun", "records") for argv in _store_cases()) >= 5


@pytest.mark.parametrize("argv", _store_cases(), ids=lambda v: " ".join(v[1:])[:70])
def test_store_commands_run_against_a_store(argv: tuple[str, ...], tmp_path: Path) -> None:
    """Each store command runs over a local store holding one record of every kind, placeholders filled in,
    and prints a record or a key."""
    from training.store.local import LocalDirStore

    store = LocalDirStore(tmp_path)
    for key, data in SEEDED.items():
        store.put_bytes(key, data)
    filled = _fill(argv)
    if filled[0] == "longrun":
        filled[0] = str(VENV_BIN / "longrun")
    env = {k: v for k, v in os.environ.items() if k not in ("AWS_ENDPOINT_URL", "LONGRUN_S3")}
    env["LONGRUN_STORE_DIR"] = str(tmp_path)
    out = subprocess.run(filled, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, f"`{' '.join(filled)}` exited {out.returncode}: {out.stderr[-2000:]}"
    assert "demo" in out.stdout or '"kind"' in out.stdout, f"`{' '.join(filled)}` printed {out.stdout!r}"


def test_the_checker_catches_bad_commands() -> None:
    """The parser behind these tests sees what a broken runbook would show."""
    bad = "```bash\nsinfo -R | notaprogram --x\nlongrun checkpoints list --run <run> --bogus\n```"
    argvs = [a for line in command_lines(code_blocks(bad)[0]) for a in simple_commands(line)]
    assert [a[0] for a in argvs] == ["sinfo", "notaprogram", "longrun"]
    assert options(argvs[2]) == ["--run", "--bogus"]
    assert shutil.which("notaprogram") is None
    assert "--bogus" not in help_text(str(VENV_BIN / "longrun"), "checkpoints", "list")
