"""What a module's mutants came to (docs/mutants.md): killed, surviving (each triaged in
mutation.yaml as equivalent or as a known gap, or not yet triaged), not competent (the mutant
could not even be run), not run; the kill rate, and triage entries that no longer match.

The kill rate is killed / (killed + surviving - equivalent): a triaged gap still counts as a
survivor; an equivalent mutant (no run can tell it from the original) is not scored.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.mutate.targets import Target, Triage


@dataclass(frozen=True)
class Mutant:
    id: str  # operator#occurrence: stable while the module's code is
    operator: str
    line: int
    at: str  # "line: source text"
    function: str
    outcome: str  # killed, timeout, survived, incompetent, not run
    diff: str = ""


@dataclass
class ModuleResult:
    module: str
    mutants: list[Mutant] = field(default_factory=list)
    equivalent: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    untriaged: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # triage entries that no longer match, with why

    def count(self, *outcomes: str) -> int:
        return sum(1 for m in self.mutants if m.outcome in outcomes)

    @property
    def kill_rate(self) -> float | None:
        scored = self.count("killed", "timeout") + self.count("survived") - len(self.equivalent)
        return None if scored <= 0 else self.count("killed", "timeout") / scored

    @property
    def clean(self) -> bool:
        """Every mutant run, every survivor triaged, every triage entry current."""
        return not (self.untriaged or self.stale or self.count("not run"))

    def as_dict(self) -> dict[str, Any]:
        rate = self.kill_rate
        return {
            "module": self.module,
            "mutants": len(self.mutants),
            "killed": self.count("killed"),
            "timeout": self.count("timeout"),
            "survived": self.count("survived"),
            "incompetent": self.count("incompetent"),
            "not_run": self.count("not run"),
            "equivalent": self.equivalent,
            "gaps": self.gaps,
            "untriaged": self.untriaged,
            "stale_triage": self.stale,
            "kill_rate": None if rate is None else round(rate, 4),
            "survivors": [asdict(m) for m in self.mutants if m.outcome == "survived"],
        }


def _outcome(result: dict | None) -> str:
    if result is None:
        return "not run"
    worker, test = result.get("worker_outcome"), result.get("test_outcome")
    if worker == "timeout" or (test == "killed" and (result.get("output") or "").strip() == "timeout"):
        return "timeout"
    if worker == "normal" and test in ("killed", "survived", "incompetent"):
        return str(test)
    return "incompetent"  # the worker itself failed (exception, abnormal): nothing was judged


def mutants(jobs: list[tuple[dict, dict | None]], source: str) -> list[Mutant]:
    """The mutants cosmic-ray ran or will run (filtered operators left out), in line order."""
    lines = source.splitlines()
    out = []
    for job, result in jobs:
        if result is not None and result.get("worker_outcome") == "skipped":
            continue
        for m in job["mutations"]:
            line = int(m["start_pos"][0])
            text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
            out.append(
                Mutant(
                    id=f"{m['operator_name']}#{m['occurrence']}",
                    operator=m["operator_name"],
                    line=line,
                    at=f"{line}: {text}",
                    function=str(m.get("definition_name") or ""),
                    outcome=_outcome(result),
                    diff=(result or {}).get("diff") or "",
                )
            )
    return sorted(out, key=lambda m: (m.line, m.id))


def judge(target: Target, found: list[Mutant], triage: dict[str, Triage]) -> ModuleResult:
    result = ModuleResult(target.module, found)
    by_id = {m.id: m for m in found}
    for mutant_id, entry in sorted(triage.items()):
        mutant = by_id.get(mutant_id)
        if mutant is None:
            result.stale.append(f"{mutant_id}: no such mutant now (the code changed): triage it again")
        elif entry.at != mutant.at:
            result.stale.append(f"{mutant_id}: triaged at {entry.at!r}, now at {mutant.at!r}: triage it again")
        elif mutant.outcome in ("killed", "timeout"):
            result.stale.append(f"{mutant_id}: triaged as {entry.verdict} but now killed: take it off")
    for mutant in found:
        if mutant.outcome != "survived":
            continue
        entry = triage.get(mutant.id)
        if entry is None or entry.at != mutant.at:
            result.untriaged.append(mutant.id)
        elif entry.verdict == "equivalent":
            result.equivalent.append(mutant.id)
        else:
            result.gaps.append(mutant.id)
    return result


def lines(result: ModuleResult, folder: Path | None = None) -> list[str]:
    """The module's summary and every survivor not triaged (with its diff), for the terminal."""
    rate = result.kill_rate
    shown_rate = "n/a" if rate is None else f"{100 * rate:.1f} %"
    out = [
        f"{result.module}: {len(result.mutants)} mutants: {result.count('killed')} killed, "
        f"{result.count('timeout')} timed out, {result.count('survived')} survived "
        f"({len(result.equivalent)} equivalent, {len(result.gaps)} known gaps, {len(result.untriaged)} untriaged), "
        f"{result.count('incompetent')} not competent, {result.count('not run')} not run; kill rate {shown_rate}"
    ]
    by_id = {m.id: m for m in result.mutants}
    for mutant_id in result.untriaged:
        m = by_id[mutant_id]
        out.append(f"  SURVIVED {m.id} in {m.function or '?'} at line {m.at}")
        out += [
            f"    {d}" for d in m.diff.splitlines() if d.startswith(("+", "-")) and not d.startswith(("+++", "---"))
        ]
    out += [f"  STALE TRIAGE {s}" for s in result.stale]
    return out
