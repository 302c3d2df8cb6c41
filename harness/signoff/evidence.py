"""The evidence behind the gates, carried into a sign-off beside the verdict (issue 53 part 5):
fuzzing figures (`make fuzz`'s fuzz.json, harness/fuzz/run.py) and mutation figures (`make
mutate`'s mutate.json, harness/mutate/cli.py). Shown in summary.md, on the page and in
report.json; never part of the verdict (their own jobs fail on a finding or a survivor).

Each file is checked when read: a file that is not one is an error naming it and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.errors import HarnessError


def _count(data: dict[str, Any], key: str, where: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise HarnessError(f"{where}: {key} must be a count, got {value!r}")
    return value


def _load(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise HarnessError(f"{what} {path}: unreadable: {e}") from None
    if not isinstance(data, dict):
        raise HarnessError(f"{what} {path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_fuzz(path: Path) -> dict[str, Any]:
    """fuzz.json: the model, examples judged and passed, examples per second, the findings."""
    where = f"fuzz figures {path}"
    data = _load(path, "fuzz figures")
    if not isinstance(data.get("model"), str) or not isinstance(data.get("findings"), list):
        raise HarnessError(f"{where}: expected the model and a findings list (python -m harness fuzz's fuzz.json)")
    judged, passed = _count(data, "judged", where), _count(data, "passed", where)
    if passed > judged:
        raise HarnessError(f"{where}: passed ({passed}) exceeds judged ({judged})")
    rate = data.get("examples_per_second")
    if rate is not None and (not isinstance(rate, int | float) or isinstance(rate, bool) or rate < 0):
        raise HarnessError(f"{where}: examples_per_second must be a rate, got {rate!r}")
    findings = [str(f.get("first_failing_check", "?")) for f in data["findings"] if isinstance(f, dict)]
    keep = ("model", "seed", "examples", "judged", "passed", "examples_per_second", "seconds")
    return {k: data.get(k) for k in keep} | {"findings": findings, "path": str(path)}


def read_mutate(path: Path) -> dict[str, Any]:
    """mutate.json: per module the mutants, killed, surviving, equivalent and untriaged, the rate."""
    where = f"mutation figures {path}"
    data = _load(path, "mutation figures")
    modules = data.get("modules")
    if not isinstance(modules, list) or not modules:
        raise HarnessError(f"{where}: expected a non-empty modules list (python -m harness mutate's mutate.json)")
    rows = []
    for i, m in enumerate(modules):
        if not isinstance(m, dict) or not isinstance(m.get("module"), str):
            raise HarnessError(f"{where}: modules[{i}]: expected an object naming its module")
        counts = {k: _count(m, k, f"{where}: modules[{i}]") for k in ("mutants", "killed", "timeout", "survived")}
        lists = {k: m.get(k) for k in ("equivalent", "gaps", "untriaged")}
        if not all(isinstance(v, list) for v in lists.values()):
            raise HarnessError(f"{where}: modules[{i}]: equivalent, gaps and untriaged must be lists")
        rows.append(
            {"module": m["module"], **counts} | {k: len(v) for k, v in lists.items()} | {"rate": m.get("kill_rate")}
        )
    return {"modules": rows, "path": str(path)}


def fuzz_line(data: dict[str, Any] | None) -> str:
    if not data:
        return "not given for this sign-off (make fuzz, then signoff --fuzz FILE)"
    rate = data.get("examples_per_second")
    found = f"{len(data['findings'])} finding(s): {', '.join(data['findings'])}" if data["findings"] else "no finding"
    return (
        f"{data['model']}: {data['passed']}/{data['judged']} examples passed (seed {data.get('seed')}, "
        f"{rate if rate is not None else '?'} examples/s), {found}"
    )


def mutate_line(data: dict[str, Any] | None) -> str:
    if not data:
        return "not given for this sign-off (make mutate, then signoff --mutate FILE)"
    parts = []
    for m in data["modules"]:
        rate = "n/a" if m["rate"] is None else f"{100 * m['rate']:.1f} %"
        parts.append(
            f"{m['module']}: {rate} killed ({m['killed'] + m['timeout']} of {m['mutants']}, "
            f"{m['equivalent']} equivalent, {m['gaps']} known gaps, {m['untriaged']} untriaged)"
        )
    return "; ".join(parts)
