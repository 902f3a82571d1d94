"""The structure rules of docs/architecture.md, checked against the code.

- The import contracts in pyproject.toml ([tool.importlinter]: no loops, the layer order, the job side
  without the orchestrator) hold, and `lint-imports` fails when a violation is planted in a copy of the
  packages (so the check can fail).
- Only the Slurm layer builds the argv of a Slurm command.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

#: Slurm's commands: an argv that starts with one of these runs Slurm.
SLURM_COMMANDS = frozenset(
    {"sbatch", "srun", "salloc", "scancel", "scontrol", "squeue", "sinfo", "sacct", "sacctmgr", "sstat"}
)
#: Where such an argv may be built, and why.
SLURM_ARGV_ALLOWED = {
    "plugins/longrun/slurm": "the Slurm layer: every Slurm command the orchestrator runs",
    "plugins/longrun/stack": "starts and stops the local cluster (slurmctld, slurmd) the tests and demo use",
    "training/spares/supervisor.py": (
        "the job side, inside its own allocation: names its nodes (scontrol show hostnames) and asks"
        " squeue for its own job; `training` may not import the orchestrator's Slurm layer"
    ),
}


def _lint_imports(copy: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`lint-imports` over the checkout, or over a copy of its packages (run from the copy, so that the
    copy is found before the editable install)."""
    env = dict(os.environ)
    if copy is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(copy), str(copy / "plugins")])
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=copy or ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_import_contracts_hold() -> None:
    out = _lint_imports()
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "broken" not in out.stdout.lower().replace("0 broken", "")


def _copy_packages(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "training", dest / "training", ignore=ignore)
    shutil.copytree(ROOT / "plugins" / "longrun", dest / "plugins" / "longrun", ignore=ignore)


def _plant(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


@pytest.mark.parametrize(
    ("module", "planted", "contract"),
    [
        (
            "training/config.py",
            "import longrun.runspec",
            "The job side installs and runs without the orchestrator",
        ),
        ("training/config.py", "import airflow", "The job side installs and runs without the orchestrator"),
        ("plugins/longrun/slurm/validate.py", "import longrun.launch", "No import loops, at any depth"),
        ("training/records/schema.py", "import training.records.alert", "No import loops, at any depth"),
        ("plugins/longrun/stack/layout.py", "import longrun.votes", "The orchestrator's layers"),
        ("training/store/local.py", "import training.config", "The job side's layers"),
    ],
)
def test_a_planted_violation_breaks_the_contracts(
    tmp_path: Path, module: str, planted: str, contract: str
) -> None:
    _copy_packages(tmp_path)
    _plant(tmp_path / module, planted)
    out = _lint_imports(tmp_path)
    assert out.returncode != 0, out.stdout[-4000:]
    assert f"{contract} BROKEN" in out.stdout, out.stdout[-4000:]


def _slurm_argvs(path: Path) -> list[tuple[int, str]]:
    """(line, command) of every list or tuple literal whose first item is the name of a Slurm command."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.List | ast.Tuple) and node.elts:
            first = node.elts[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                if first.value in SLURM_COMMANDS:  # an argv; a shell line for a job script is not
                    found.append((node.lineno, first.value))
    return found


def _allowed(rel: str) -> bool:
    return any(rel == p or rel.startswith(p + "/") for p in SLURM_ARGV_ALLOWED)


def test_only_the_slurm_layer_builds_slurm_commands() -> None:
    offenders = []
    for top in ("plugins/longrun", "training", "dags"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not _allowed(rel):
                offenders += [f"{rel}:{line}: {cmd}" for line, cmd in _slurm_argvs(path)]
    assert not offenders, "Slurm commands outside the Slurm layer (use a SlurmClient method):\n" + "\n".join(
        offenders
    )


def test_the_slurm_command_check_sees_an_argv(tmp_path: Path) -> None:
    planted = tmp_path / "x.py"
    planted.write_text('import subprocess\nsubprocess.run(["scontrol", "update", "JobId=1"])\n')
    assert _slurm_argvs(planted) == [(2, "scontrol")]


# --- docs/architecture.md agrees with the code ---

DOC = ROOT / "docs" / "architecture.md"


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _table_first_cells(section: str) -> list[str]:
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    return [row.split("|")[1].strip() for row in rows[1:]]  # rows[0] is the header


def _names(cell: str) -> set[str]:
    return {part.strip().strip("`") for part in cell.split(",") if part.strip()}


def _layers_contracts() -> dict[str, list[set[str]]]:
    """container -> its layers, top first, as pyproject.toml's import-linter contracts declare them."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {
        c["containers"][0]: [
            {f"{c['containers'][0]}.{name.strip()}" for name in layer.replace(":", "|").split("|")}
            for layer in c["layers"]
        ]
        for c in config["contracts"]
        if c["type"] == "layers"
    }


@pytest.mark.parametrize("container", ["longrun", "training"])
def test_the_documented_layers_are_the_enforced_layers(container: str) -> None:
    documented = [_names(cell) for cell in _table_first_cells(_section(f"Layers of `{container}`"))]
    assert documented == _layers_contracts()[container]


def _packages_and_modules() -> set[str]:
    """Every package of `longrun` and `training`, every top-level module of `longrun`, every DAG file."""
    found = {f"dags/{p.name}" for p in (ROOT / "dags").glob("*.py")}
    for top, base in (("longrun", ROOT / "plugins" / "longrun"), ("training", ROOT / "training")):
        found.add(top)
        for init in base.rglob("__init__.py"):
            if "__pycache__" not in init.parts and init.parent != base:
                found.add(".".join([top, *init.parent.relative_to(base).parts]))
        if top == "longrun":
            found |= {f"longrun.{p.stem}" for p in base.glob("*.py") if p.stem != "__init__"}
    return found


def test_every_package_module_and_dag_is_in_the_doc() -> None:
    text = DOC.read_text()
    missing = sorted(name for name in _packages_and_modules() if f"`{name}`" not in text)
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_the_documented_record_kinds_are_the_registry() -> None:
    from training.records import KINDS

    documented = set().union(*(_names(cell) for cell in _table_first_cells(_section("Record kinds"))))
    assert documented == set(KINDS), (sorted(documented - set(KINDS)), sorted(set(KINDS) - documented))


# --- every name is imported from the module that defines it ---

#: Packages whose `__init__` is a published facade (docs/contracts.md "The job-side API"): users import
#: `from training.api import Guard`, and custom checks `from training.checks import Check`.
FACADES = {"training.api", "training.checks"}


def _module_file(module: str) -> Path | None:
    top, *rest = module.split(".")
    base = {"training": ROOT / "training", "longrun": ROOT / "plugins" / "longrun"}.get(top)
    if base is None:
        return None
    path = base.joinpath(*rest)
    if (path / "__init__.py").exists():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").exists() else None


def _defined_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _second_hand_imports(path: Path) -> list[str]:
    """`from M import n` in `path` where M (of this repo, not a facade) does not define n itself."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
            continue
        if node.module in FACADES or (source := _module_file(node.module)) is None:
            continue
        defined = _defined_names(source)
        for alias in node.names:
            if alias.name not in defined and _module_file(f"{node.module}.{alias.name}") is None:
                found.append(f"{node.lineno}: from {node.module} import {alias.name}")
    return found


def test_every_name_is_imported_from_where_it_is_defined() -> None:
    offenders = []
    for top in ("plugins/longrun", "training", "dags", "tests", "bench"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if "fixtures" not in path.parts:
                offenders += [f"{path.relative_to(ROOT)}:{hit}" for hit in _second_hand_imports(path)]
    assert not offenders, "import these from the module that defines them:\n" + "\n".join(offenders)


def test_the_second_hand_import_check_sees_one(tmp_path: Path) -> None:
    planted = tmp_path / "x.py"
    planted.write_text(
        "from training.store.factory import ObjectStore\nfrom training.store.interface import NotFound\n"
    )
    assert _second_hand_imports(planted) == ["1: from training.store.factory import ObjectStore"]


# --- no long function without a reason ---

#: A function longer than this many lines (def to end, nested functions counted in their parent) says
#: why it is one function, in its docstring.
LONG_FUNCTION_LINES = 60
WHY_ONE_FUNCTION = "Why one function:"


def _long_functions_without_why(source: str) -> list[str]:
    """(line: name, length) of every function or method in `source` over LONG_FUNCTION_LINES lines whose
    docstring does not say why it is one function."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > LONG_FUNCTION_LINES and WHY_ONE_FUNCTION not in (ast.get_docstring(node) or ""):
                found.append(f"{node.lineno}: {node.name} ({length} lines)")
    return found


def test_long_functions_say_why() -> None:
    offenders = []
    for top in ("plugins/longrun", "training"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            offenders += [f"{rel}:{hit}" for hit in _long_functions_without_why(path.read_text())]
    assert not offenders, (
        f"split these, or say in the docstring ({WHY_ONE_FUNCTION} ...) why each is one function:\n"
        + "\n".join(offenders)
    )


def test_the_long_function_check_sees_one() -> None:
    def planted(lines: int, doc: str = "Does much.") -> str:
        """A function of `lines` lines: the def, a one-line docstring, then assignments."""
        return f'def long():\n    """{doc}"""\n' + "".join(f"    x{i} = {i}\n" for i in range(lines - 2))

    assert _long_functions_without_why(planted(61)) == ["1: long (61 lines)"]
    assert _long_functions_without_why(planted(60)) == []
    assert _long_functions_without_why(planted(61, f"Does much. {WHY_ONE_FUNCTION} a table.")) == []
