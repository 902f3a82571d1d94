#!/usr/bin/env python3
"""Count the record lookups among the lines of `grep -rn '\\.get("' plugins/longrun training`, at any commit.

Issue 11 asks for 70% fewer *record* lookups (a reader taking a field of a record by its string key), but
the raw grep also counts what is no record. This script takes the same lines (`git grep` of the commit's
tracked files; the working tree with `--worktree`) and sorts each into one category:

- `record`: a record of the store (alert, check, progress, manifest, save, report, validation, promotion,
  pick, suspect mark, incident, segment, ...), a part of one (an alert's evidence, an incident's copy of
  its alert, a timeline entry's details, a record's undeclared `extra`), or longrun's own JSON handed from
  one task or trigger to another (an XCom result, a trigger event, a saver's result file).
- `typed layer`: inside the record types themselves (training/records/, training/records/schema.py,
  training/checkpoint/manifest.py): the one place where a record's keys are read, so that readers get attributes.
- the things that are no record, each by a named rule: `environment`, `slurm` (Slurm's JSON, scontrol
  output and the Slurm client's own job state dict), `dcgmi` output, `airflow` (DAG params, run conf,
  task context, HITL replies, connection extras, HTTP requests), `rest` (Airflow REST replies),
  `boto` (S3 replies), `route` (FastAPI `@app.get("/...")`), `expectations` (Great Expectations
  results), `config` (the stack's saved layout, the store spec, a job spec or RunSpec's input, the
  local hash cache), `tally` (a count the UI computed from typed records).

A line is classified by its file, the function it is in (found with `ast` on that commit's file) and the
expression in front of each `.get("` on it (its *receiver*). Rules only ever take a line OUT of
`record`, each for a stated reason; a line no rule matches counts as a record lookup, so the record count
errs high, never low. A line with several `.get("` counts as a record lookup if any of them is one.

    python scripts/count_record_lookups.py [REV]          # counts (REV: a commit; default HEAD)
    python scripts/count_record_lookups.py REV --list record   # the lines of one category ("all": every line)
    python scripts/count_record_lookups.py --worktree     # the files as they are on disk

Counts (this script, issue 11): see the issue's closing note.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

PATHS = ("plugins/longrun", "training")
LITERAL = '.get("'  # what the grep pattern \\.get\(" matches
RECORD = "record"


@dataclass(frozen=True)
class Rule:
    """Lines whose file matches `file`, whose enclosing function matches `func` (None: any) and whose
    receiver matches `receiver` (None: any) are `category`, for `why`."""

    category: str
    file: str
    receiver: str | None
    why: str
    func: str | None = None

    def matches(self, path: str, func: str, receiver: str) -> bool:
        return (
            re.search(self.file, path) is not None
            and (self.func is None or re.fullmatch(self.func, func) is not None)
            and (self.receiver is None or re.search(self.receiver, receiver) is not None)
        )


# In order: the first rule that matches an occurrence decides it.
RULES: tuple[Rule, ...] = (
    # A record read inside a file that is otherwise about something else.
    Rule(
        RECORD,
        r"health/dcgm\.py$",
        None,
        "describe() reads the verdict the incident record keeps",
        "describe",
    ),
    Rule("environment", r".", r"(^|\.)environ$|^env$|^_environ\(|^os\.environ", "process environment"),
    Rule(
        "typed layer",
        r"^training/records/|^training/checkpoint/manifest\.py$",
        None,
        "the record types' own parsing (from_json, validate)",
    ),
    Rule(
        "slurm", r"^plugins/longrun/slurm/", None, "Slurm JSON, scontrol output, the Slurm client's job state"
    ),
    Rule("dcgmi", r"health/dcgm\.py$", None, "dcgmi diag --json output"),
    Rule("route", r"/ui/app\.py$", r"^app$", "FastAPI route decorator"),
    Rule("airflow", r"/ui/app\.py$", r"^(conf|request\.\w+)$", "DAG run conf, HTTP request"),
    Rule("airflow", r"/hooks/slurm\.py$", r"^self\._extra$", "Airflow connection extra"),
    Rule(
        "airflow",
        r".",
        r"^(context|params|self\.params|self\.run_params|run_params|dag_run\.conf|conf)$",
        "Airflow task context, DAG params, run conf",
    ),
    Rule("airflow", r"/operators/slurm\.py$", r"^event$", "SlurmJobTrigger's event (Slurm job state)"),
    Rule(
        "airflow",
        r"/(incident/approval|tasks/node_return)\.py$",
        r"^(response|approval|skipped|who)$",
        "HITL reply and Airflow's skip XCom",
    ),
    Rule("airflow", r"/tasks/node_return\.py$", r"^selected$", "node_return's params as selected"),
    Rule("airflow", r"/runspec\.py$", r"^values$", "RunSpec built from DAG params"),
    Rule("rest", r"/airflow_rest\.py$", None, "the Airflow REST client: its replies and its own get()"),
    Rule("rest", r"/drill\.py$", r"^ti$", "Airflow REST replies (task instances)"),
    Rule("rest", r"/stack/airflow\.py$", r"^v$", "Airflow health endpoint reply"),
    Rule("boto", r"^training/store/s3\.py$", None, "boto3 replies and errors"),
    Rule("expectations", r"/audit/expectations\.py$", None, "Great Expectations validation results"),
    Rule("config", r"/stack/layout\.py$", r"^saved$", "the stack's saved layout"),
    Rule("tally", r"/ui/page\.py$", r"^v$", "check_counts(): check -> verdict -> count, computed", "_tiles"),
    Rule(
        "config",
        r"^training/store/(local|factory)\.py$",
        r"^(spec|cached)$",
        "the store spec, the local hash cache",
    ),
)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def grep_lines(rev: str | None) -> Iterator[tuple[str, int, str]]:
    """(path, line number, text) of every line the issue's grep counts: `git grep` of commit `rev`'s
    tracked files, or (`rev` None) every text file on disk under PATHS, as `grep -rn` reads them."""
    if rev is None:
        yield from _disk_lines()
        return
    out = subprocess.run(
        ["git", "grep", "-n", "-F", LITERAL, rev, "--", *PATHS], capture_output=True, text=True, check=False
    ).stdout
    for line in out.splitlines():
        path, num, text = line.split(":", 1)[1].split(":", 2)
        yield path, int(num), text


def _disk_lines() -> Iterator[tuple[str, int, str]]:
    for top in PATHS:
        for path in sorted(p for p in Path(top).rglob("*") if p.is_file()):
            data = path.read_bytes()
            if b"\0" in data:
                continue  # binary: grep does not print its lines
            for num, text in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
                if LITERAL in text:
                    yield path.as_posix(), num, text


@cache
def functions(rev: str | None, path: str) -> tuple[tuple[int, int, str], ...]:
    """(first line, last line, name) of every function and class of the file, outermost first."""
    try:
        source = git("show", f"{rev}:{path}") if rev else Path(path).read_text()
        tree = ast.parse(source)
    except (OSError, subprocess.CalledProcessError, SyntaxError):
        return ()
    found = [
        (n.lineno, n.end_lineno or n.lineno, n.name)
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]
    return tuple(sorted(found))


def enclosing(rev: str | None, path: str, num: int) -> str:
    """The innermost function (or class) around line `num`; '' at module level."""
    name = ""
    for first, last, n in functions(rev, path):
        if first <= num <= last:
            name = n
    return name


def receivers(text: str) -> list[str]:
    """The expression in front of each `.get("` of the line, e.g. `os.environ`, `inc.extra`,
    `(plan.get("x") or {})`, `self.get("/importErrors")`."""
    out = []
    for m in re.finditer(re.escape(LITERAL), text):
        i = m.start()
        while i > 0:
            c = text[i - 1]
            if c.isalnum() or c in "_.":
                i -= 1
            elif c in ")]":
                depth, j = 0, i - 1
                while j >= 0:
                    depth += {")": 1, "]": 1, "(": -1, "[": -1}.get(text[j], 0)
                    if depth == 0:
                        break
                    j -= 1
                i = j
            else:
                break
        out.append(text[i : m.start()].strip())
    return out


def classify(rev: str | None, path: str, num: int, text: str) -> tuple[str, str]:
    """(category, why) of one grep line."""
    func = enclosing(rev, path, num)
    if re.search(r"@\w+\.get\(\"/", text):
        return "route", "FastAPI route decorator"
    decided = []
    for recv in receivers(text):
        rule = next((r for r in RULES if r.matches(path, func, recv)), None)
        decided.append((rule.category, rule.why) if rule else (RECORD, f"receiver {recv!r} in {func or '-'}"))
    record = [d for d in decided if d[0] == RECORD]
    return record[0] if record else decided[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", nargs="?", default="HEAD", help="a commit (default HEAD)")
    ap.add_argument("--worktree", action="store_true", help="read the files on disk instead of a commit")
    ap.add_argument("--list", metavar="CATEGORY", help="print the lines of this category ('all': every line)")
    args = ap.parse_args(argv)
    rev = None if args.worktree else git("rev-parse", "--short", args.rev).strip()
    counts: Counter[str] = Counter()
    for path, num, text in grep_lines(rev):
        category, why = classify(rev, path, num, text)
        counts[category] += 1
        if args.list in (category, "all"):
            print(f"{category:12} {path}:{num}: {text.strip()[:110]}   [{why}]")
    total = sum(counts.values())
    print(
        f"{rev or 'worktree'}: {total} lines; record lookups {counts[RECORD]}; not records {total - counts[RECORD]}"
    )
    print("  " + ", ".join(f"{c} {n}" for c, n in counts.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
