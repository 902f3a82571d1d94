"""DCGM diagnostics: which `dcgmi diag` level the evidence calls for, and its JSON parsed into a verdict.

Levels (DCGM's suites): 1 quick deployment checks (seconds), 2 medium (~2 min), 3 long hardware
diagnostics (~15 min, includes the compute "Diagnostic" test and targeted stress), 4 extended (memtest,
pulse). A NaN/Inf alone is level 2 (memory and PCIe are the usual suspects); a finite wrong value seen by
recompute or the weight vote needs the compute tests of level 3; a node with an earlier incident, or a
fault that persisted on replay, gets level 4. A clean `dcgmi diag` does NOT prove a GPU free of SDC: the
replay probe (diagnose.py) runs either way, and its failure alone convicts the node.

`dcgmi diag --json` has no published stable schema (NVIDIA says to pin and test per release). The parser
reads the documented shape, tolerant of its variants: a top object "DCGM Diagnostic" (older releases:
"DCGM GPU Diagnostic") with "test_categories": [{"category", "tests": [{"name", "results": [{"gpu_id" or
"entity_id", "status", "warnings"/"info"}]}]}], an optional "runtime_error", and a summary whose
"Overall Result" may be absent. Any "Fail" result, or a runtime error, fails the node.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from training.records.diagnosis import DcgmSummary

LEVELS = (1, 2, 3, 4)
_TOP_KEYS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")
_FAIL = {"fail", "failed", "error"}
_WARN = {"warn", "warning"}
_PASS = {"pass", "passed"}
_SKIP = {"skip", "skipped", "not run", "notrun", "not_run"}


def level_for(*, check: str, prior_incidents: int = 0, persistent: bool = False) -> int:
    """The `dcgmi diag -r` level an alert of `check` calls for."""
    if prior_incidents > 0 or persistent:
        return 4
    if check == "finite":
        return 2
    return 3


def command(level: int, *, gpu_ids: tuple[int, ...] = ()) -> tuple[str, ...]:
    """The argv of a diagnostic run at `level`, JSON output (`-j`), optionally on some GPUs only (`-i`)."""
    if level not in LEVELS:
        raise ValueError(f"level={level!r}: dcgmi diag suites are {LEVELS}")
    argv = ["dcgmi", "diag", "-r", str(level), "-j"]
    if gpu_ids:
        if any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpu_ids):
            raise ValueError(f"gpu_ids={gpu_ids!r}: must be non-negative integers")
        argv += ["-i", ",".join(str(g) for g in gpu_ids)]
    return tuple(argv)


@dataclass(frozen=True, slots=True, kw_only=True)
class Failure:
    """One failing (or warning) result."""

    category: str
    """DCGM's test category (e.g. `Hardware`, `Stress`)."""
    test: str
    """The test name (e.g. `Diagnostic`, `Memory`)."""
    gpu: str | None
    """The GPU (entity) id, None for a system-wide result."""
    status: str
    """`fail` or `warn`."""
    message: str
    """DCGM's warning text, joined; empty if it gave none."""
    error_ids: tuple[int, ...] = ()
    """DCGM_FR_* error ids, where the release reports them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DcgmVerdict:
    """The outcome of one `dcgmi diag` run."""

    passed: bool
    """No test failed and no runtime error."""
    level: int | None
    """The suite level, when known."""
    failures: tuple[Failure, ...] = ()
    """Failing results (and warnings, with status `warn`)."""
    tests_run: int = 0
    """Results that passed, warned or failed (skips not counted)."""
    runtime_error: str | None = None
    """A diagnostic that could not run reports this instead of results."""
    version: str | None = None
    """DCGM's version string, when reported."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else worth keeping for the incident record (the overall result text)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "level": self.level,
            "tests_run": self.tests_run,
            "runtime_error": self.runtime_error,
            "version": self.version,
            "failures": [
                {
                    "category": f.category,
                    "test": f.test,
                    "gpu": f.gpu,
                    "status": f.status,
                    "message": f.message,
                    "error_ids": list(f.error_ids),
                }
                for f in self.failures
            ],
            **self.extra,
        }

    def summary(self) -> str:
        return describe(self.to_dict())


def describe(result: Mapping[str, Any] | None) -> str:
    """One line for people from a verdict's `to_dict()` (as node_check prints it and the incident record
    keeps it); None: dcgmi is not on the node."""
    if result is None:
        return "dcgmi absent on the node"
    d = DcgmSummary.shown(result)
    if d.runtime_error:
        return f"dcgmi diag could not run: {d.runtime_error}"
    if not d.failed and d.passed:
        return f"dcgmi diag -r {d.level}: passed ({d.tests_run} results)"
    parts = [f"{f.test}@gpu{f.gpu}" if f.gpu is not None else str(f.test) for f in d.failed]
    named = ", ".join(parts) or d.overall_result or "no failing test named"
    return f"dcgmi diag -r {d.level}: FAILED {named}"


class DcgmParseError(ValueError):
    """The text is not `dcgmi diag --json` output this parser understands."""


def _messages(result: Mapping[str, Any]) -> tuple[str, tuple[int, ...]]:
    texts: list[str] = []
    ids: list[int] = []
    for key in ("warnings", "errors"):
        for w in result.get(key) or ():
            if isinstance(w, Mapping):
                texts.append(str(w.get("warning") or w.get("error") or w.get("message") or ""))
                if isinstance(w.get("error_id"), int):
                    ids.append(int(w["error_id"]))
            else:
                texts.append(str(w))
    info = result.get("info")
    if isinstance(info, list):
        texts.extend(str(i) for i in info)
    elif info:
        texts.append(str(info))
    return "; ".join(t for t in texts if t), tuple(ids)


def parse(text: str, *, level: int | None = None) -> DcgmVerdict:
    """Parse `dcgmi diag -j` output. Raises DcgmParseError if it is not that JSON."""
    start = text.find("{")
    if start < 0:
        raise DcgmParseError(f"no JSON object in dcgmi output: {text[:200]!r}")
    try:
        doc = json.loads(text[start:])
    except json.JSONDecodeError as e:
        raise DcgmParseError(f"dcgmi output is not valid JSON ({e}): {text[start : start + 200]!r}") from None
    if not isinstance(doc, Mapping):
        raise DcgmParseError("dcgmi output is not a JSON object")
    top = next((doc[k] for k in _TOP_KEYS if isinstance(doc.get(k), Mapping)), None)
    if top is None:
        raise DcgmParseError(f"dcgmi output lacks {' / '.join(_TOP_KEYS)}; keys: {sorted(doc)[:10]}")
    version = doc.get("version") or top.get("version")
    runtime_error = top.get("runtime_error") or doc.get("runtime_error")
    failures: list[Failure] = []
    tests_run = 0
    categories = top.get("test_categories")
    if not isinstance(categories, list) and not runtime_error:
        raise DcgmParseError("dcgmi output has neither test_categories nor runtime_error")
    for cat in categories or ():
        cat_name = str(cat.get("category", "?"))
        for test in cat.get("tests") or ():
            test_name = str(test.get("name", "?"))
            for res in test.get("results") or ():
                status = str(res.get("status", "")).strip().lower()
                if status in _SKIP or not status:
                    continue
                tests_run += 1
                if status in _PASS:
                    continue
                gpu = res.get("gpu_id", res.get("entity_id"))
                message, ids = _messages(res)
                failures.append(
                    Failure(
                        category=cat_name,
                        test=test_name,
                        gpu=None if gpu is None else str(gpu),
                        status="fail" if status in _FAIL else "warn" if status in _WARN else status,
                        message=message,
                        error_ids=ids,
                    )
                )
    overall = top.get("Overall Result") or doc.get("Overall Result")
    failed = bool(runtime_error) or any(f.status not in ("warn",) for f in failures)
    if isinstance(overall, str) and overall.strip().lower() in _FAIL:
        failed = True
    extra = {"overall_result": overall} if overall is not None else {}
    return DcgmVerdict(
        passed=not failed,
        level=level,
        failures=tuple(failures),
        tests_run=tests_run,
        runtime_error=str(runtime_error) if runtime_error else None,
        version=str(version) if version else None,
        extra=extra,
    )
