"""mutation.yaml: what automated mutation testing mutates, what judges each module, and the
survivors already triaged (docs/mutants.md).

    targets:
      models/universal/rotating_cache.py:       # a module, relative to the repo
        parity: {model: minicpm5-2b-mini, k: rotating}   # python -m harness parity --model M -k K -x
        tests: [tests/test_compare.py]           # python -m pytest -x these files (either or both)
      models/universal/rope.py:
        parity:                                  # or a list of selections, run in order
          - {model: llama-rope-yarn-mini}
          - {model: llama-rope-llama3-mini, k: long-chat}
    triaged:
      - module: models/universal/rotating_cache.py
        mutant: core/NumberReplacer#3            # the id `make mutate` prints: operator#occurrence
        at: "58: return self.keep + 1"           # its line and text when triaged (moved or edited: stale)
        verdict: equivalent                       # or: gap (a known hole, still counted as surviving)
        reason: why no run can tell it from the original, or what would catch it

A bad file is an error naming the entry and what was expected; nothing is guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.errors import HarnessError

VERDICTS = ("equivalent", "gap")


class MutationConfigError(HarnessError):
    """mutation.yaml is unreadable or names something wrongly."""


@dataclass(frozen=True)
class Target:
    module: str  # repo-relative path of the mutated module
    parity: tuple[tuple[str, str | None], ...] = ()  # (model, -k expression or None), in order
    tests: tuple[str, ...] = ()

    @property
    def slug(self) -> str:
        return self.module.removesuffix(".py").replace("/", ".")

    def commands(self, python: str) -> list[list[str]]:
        """The runs that judge one mutant, in order, the test files (seconds) before the parity
        selections (a minute each); the first that fails kills it."""
        out = []
        if self.tests:
            out.append([python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *self.tests])
        for model, k in self.parity:
            run = [python, "-m", "harness", "parity", "--model", model]
            out.append(run + (["-k", k] if k else []) + ["-x"])
        return out


@dataclass(frozen=True)
class Triage:
    module: str
    mutant: str
    at: str
    verdict: str
    reason: str


@dataclass
class MutationConfig:
    targets: dict[str, Target] = field(default_factory=dict)
    triaged: list[Triage] = field(default_factory=list)

    def select(self, modules: list[str]) -> list[Target]:
        if not modules:
            return list(self.targets.values())
        unknown = [m for m in modules if m not in self.targets]
        if unknown:
            raise MutationConfigError(
                f"--module {', '.join(unknown)}: not a target of mutation.yaml (targets: {', '.join(self.targets)})"
            )
        return [self.targets[m] for m in modules]

    def triage_of(self, module: str) -> dict[str, Triage]:
        return {t.mutant: t for t in self.triaged if t.module == module}


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise MutationConfigError(f"{where}: expected a non-empty list of paths, got {value!r}")
    return tuple(value)


def _target(module: str, entry: Any, root: Path, where: str) -> Target:
    if not isinstance(entry, dict) or not entry or set(entry) - {"parity", "tests"}:
        raise MutationConfigError(f"{where}: expected a mapping with parity and/or tests, got {entry!r}")
    if not module.endswith(".py") or not (root / module).is_file():
        raise MutationConfigError(f"{where}: {module}: expected a Python module of this repository")
    parity = []
    if "parity" in entry:
        selections = entry["parity"] if isinstance(entry["parity"], list) else [entry["parity"]]
        for i, selection in enumerate(selections):
            at = f"{where}.parity" + (f"[{i}]" if isinstance(entry["parity"], list) else "")
            if (
                not isinstance(selection, dict)
                or set(selection) - {"model", "k"}
                or not isinstance(selection.get("model"), str)
            ):
                raise MutationConfigError(f"{at}: expected {{model: NAME, k: EXPRESSION}}, got {selection!r}")
            k = selection.get("k")
            if k is not None and not isinstance(k, str):
                raise MutationConfigError(f"{at}.k: expected a -k expression, got {k!r}")
            parity.append((selection["model"], k))
        if not parity:
            raise MutationConfigError(f"{where}.parity: expected a selection or a non-empty list of them")
    tests = _strings(entry["tests"], f"{where}.tests") if "tests" in entry else ()
    missing = [t for t in tests if not (root / t.partition("::")[0]).is_file()]
    if missing:
        raise MutationConfigError(f"{where}.tests: no such test file: {', '.join(missing)}")
    return Target(module, tuple(parity), tests)


def _triage(entry: Any, where: str) -> Triage:
    keys = ("module", "mutant", "at", "verdict", "reason")
    if not isinstance(entry, dict) or set(entry) != set(keys):
        raise MutationConfigError(f"{where}: expected exactly the keys {', '.join(keys)}, got {entry!r}")
    if not all(isinstance(entry[k], str) and entry[k].strip() for k in keys):
        raise MutationConfigError(f"{where}: every field must be non-empty text, got {entry!r}")
    if entry["verdict"] not in VERDICTS:
        raise MutationConfigError(f"{where}.verdict: expected one of {', '.join(VERDICTS)}, got {entry['verdict']!r}")
    return Triage(**{k: entry[k] for k in keys})


def load(path: Path, root: Path) -> MutationConfig:
    """mutation.yaml at `path`, its module and test paths relative to `root`."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise MutationConfigError(f"{path}: unreadable: {e}") from None
    if not isinstance(data, dict) or set(data) - {"targets", "triaged"} or not isinstance(data.get("targets"), dict):
        raise MutationConfigError(f"{path}: expected a mapping with targets (and triaged), got {type(data).__name__}")
    config = MutationConfig()
    for module, entry in data["targets"].items():
        config.targets[module] = _target(str(module), entry, root, f"{path.name}: targets.{module}")
    triaged = data.get("triaged") or []
    if not isinstance(triaged, list):
        raise MutationConfigError(f"{path.name}: triaged: expected a list, got {type(triaged).__name__}")
    seen = set()
    for i, entry in enumerate(triaged):
        triage = _triage(entry, f"{path.name}: triaged[{i}]")
        if triage.module not in config.targets:
            raise MutationConfigError(f"{path.name}: triaged[{i}].module: {triage.module} is not a target")
        if (triage.module, triage.mutant) in seen:
            raise MutationConfigError(f"{path.name}: triaged[{i}]: {triage.module} {triage.mutant} triaged twice")
        seen.add((triage.module, triage.mutant))
        config.triaged.append(triage)
    return config
