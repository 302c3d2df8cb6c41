"""The sign-off's data: the parity report it reads, and the judgement it adds.

A sign-off is rendered from a parity JSON report alone (harness/report.py writes it), so a
report from any machine can be signed off, re-rendered, or compared later. The sign-off's
own report.json is that parity report, unchanged, plus one `signoff` key: a later sign-off
reads either kind as its "previous".
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.checks import registry
from harness.errors import HarnessError
from harness.report import ItemResult, ReportFileError, read_report

SIGNED_OFF = "SIGNED OFF"
BLOCKED = "BLOCKED"
# Nothing blocks, but checks of the requested profiles did not run (deselected with -k / -m, or
# absent from the report): a partial run, never a sign-off of those profiles.
INCOMPLETE = "INCOMPLETE"
# Per check: PASS and WAIVED do not block; FAIL and ERROR do.
STATUSES = ("PASS", "WAIVED", "FAIL", "ERROR")
_REPORT_KEYS = ("harness_version", "started", "finished", "verdict", "counts", "context", "results")
_ITEM_FIELDS = {f.name for f in dataclasses.fields(ItemResult)}
_ITEM_REQUIRED = [
    f.name
    for f in dataclasses.fields(ItemResult)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
]


class ReportError(HarnessError):
    """A JSON file is not a parity report (or a sign-off's report.json); a file that is not one
    at all is harness/report.py's ReportFileError, from the reader `matrix` shares."""


def check_id(model: str, scenario: str, check: str) -> str:
    return f"{model}/{scenario}/{check}"


@dataclass
class ParityReport:
    """A parity report as harness/report.py writes it; `raw` is kept to write it back unchanged."""

    harness_version: str
    started: str
    finished: str
    verdict: str
    context: dict[str, Any]
    results: list[ItemResult]
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> ParityReport:
        if not isinstance(data, dict):
            raise ReportError(f"{where}: expected a JSON object (a parity report)")
        missing = [k for k in _REPORT_KEYS if k not in data]
        if missing:
            raise ReportError(f"{where}: not a parity report, missing key(s) {missing}")
        results = []
        for i, item in enumerate(data["results"]):
            absent = [k for k in _ITEM_REQUIRED if k not in item] if isinstance(item, dict) else []
            if absent:
                raise ReportError(f"{where}: results[{i}]: missing key(s) {absent} of a check's result")
            try:
                # Unknown keys are ignored so that a newer harness's reports stay readable.
                fields = {k: v for k, v in item.items() if k in _ITEM_FIELDS}
                results.append(ItemResult(**fields | {"details": fields.get("details") or {}}))
            except TypeError as e:
                raise ReportError(f"{where}: results[{i}]: {e}") from e
        return cls(
            harness_version=str(data["harness_version"]),
            started=str(data["started"]),
            finished=str(data["finished"]),
            verdict=str(data["verdict"]),
            context=dict(data["context"]),
            results=results,
            raw=data,
        )

    @classmethod
    def load(cls, path: Path) -> ParityReport:
        """A report file (`--from-report`, `--previous`), read and checked by `read_report`."""
        try:
            data = read_report(path)
        except ReportFileError as e:
            raise ReportError(str(e)) from e
        return cls.from_dict(data, str(path))

    @property
    def device(self) -> dict[str, str]:
        return dict(self.context.get("device", {}))

    @property
    def device_key(self) -> str:
        return str(self.device.get("key", "unknown-device"))

    @property
    def harness_commit(self) -> str:
        return str(self.context.get("harness_commit", "unknown"))

    @property
    def signoff(self) -> dict[str, Any] | None:
        """The judgement of a sign-off's report.json; None for a plain parity report."""
        return self.raw.get("signoff")

    def outcomes(self) -> dict[str, str]:
        return {check_id(r.model, r.scenario, r.check): r.outcome for r in self.results}


@dataclass(frozen=True)
class CheckStatus:
    id: str
    model: str
    scenario: str
    check: str
    tier: str
    outcome: str  # the parity outcome: passed | failed | error
    status: str  # one of STATUSES
    summary: str
    seconds: float
    peak_rss_mb: float
    first_bad_step: int | None = None
    waiver: str | None = None  # the pattern that waived it
    headline: str = ""  # a non-passing check in one line, module included (harness/signoff/headline.py)


@dataclass(frozen=True)
class Blocker:
    kind: str  # check | waiver | model | run
    subject: str
    reason: str  # in full
    headline: str = ""  # what the Blocking lists show: the reason in one line, never cut before the module


@dataclass(frozen=True)
class WaiverUse:
    check: str
    reason: str
    owner: str
    expires: str
    state: str  # active | expired
    matched: list[str]  # every check id it matches
    waived: list[str]  # the failing checks it turned into WAIVED

    @property
    def note(self) -> str:
        if self.state == "expired":
            return f"EXPIRED on {self.expires}: blocks the sign-off"
        if not self.matched:
            return "matches no check of this run"
        if not self.waived:
            return "matches only passing checks: can be removed"
        return f"waives {len(self.waived)} failing check(s)"


@dataclass(frozen=True)
class ProvenanceChange:
    key: str
    old: str
    new: str


@dataclass(frozen=True)
class ReportDiff:
    previous: str  # where the previous report was read from
    previous_generated: str
    previous_verdict: str
    newly_passing: list[str]
    newly_failing: list[str]
    added: list[str]
    removed: list[str]
    provenance_changes: list[ProvenanceChange]

    @property
    def empty(self) -> bool:
        return not (self.newly_passing or self.newly_failing or self.added or self.removed or self.provenance_changes)


@dataclass(frozen=True)
class ScenarioTiming:
    model: str
    scenario: str
    checks: int
    seconds: float
    peak_rss_mb: float


@dataclass(frozen=True)
class Signoff:
    verdict: str  # SIGNED OFF | INCOMPLETE | BLOCKED
    generated: str
    harness_version: str
    device_key: str
    requested_models: list[str]
    parity_exit_code: int | None
    machine: dict[str, str]
    checks: list[CheckStatus]
    blockers: list[Blocker]
    waivers: list[WaiverUse]
    diff: ReportDiff | None
    # Requested models of which no scenario runs on this backend: listed, not judged, not passed.
    not_run_here: list[str] = field(default_factory=list)
    # Every check the requested profiles collect on this backend (how many), and those of them
    # that have no result in the report: any makes the sign-off INCOMPLETE (or it is BLOCKED).
    expected_checks: int = 0
    not_run: list[str] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(c.status == s for c in self.checks) for s in STATUSES}

    def not_run_line(self) -> str:
        """'92 of 99 checks of the requested profiles (smollm2-135m 92)': empty when all ran."""
        if not self.not_run:
            return ""
        per_model: dict[str, int] = {}
        for cid in self.not_run:
            model = cid.split("/", 1)[0]
            per_model[model] = per_model.get(model, 0) + 1
        models = ", ".join(f"{m} {n}" for m, n in per_model.items())
        return f"{len(self.not_run)} of {self.expected_checks} checks of the requested profiles ({models})"

    @property
    def models(self) -> list[str]:
        return sorted({c.model for c in self.checks})

    def scenarios(self, model: str) -> list[str]:
        """In the order the run produced them (a profile's own order when run without xdist)."""
        return list(dict.fromkeys(c.scenario for c in self.checks if c.model == model))

    def check_names(self) -> list[str]:
        names = {c.check for c in self.checks}
        known = [c for c in registry.CHECKS if c in names]  # the registry's order first
        return known + sorted(names - set(known))

    def timings(self) -> list[ScenarioTiming]:
        """Seconds and peak memory per (model, scenario): a scenario's first check pays for its runs."""
        rows: dict[tuple[str, str], list[CheckStatus]] = {}
        for c in self.checks:
            rows.setdefault((c.model, c.scenario), []).append(c)
        return [
            ScenarioTiming(m, s, len(cs), round(sum(c.seconds for c in cs), 3), max(c.peak_rss_mb for c in cs))
            for (m, s), cs in rows.items()
        ]

    def cell(self, model: str, scenario: str, check: str) -> CheckStatus | None:
        return next(
            (c for c in self.checks if (c.model, c.scenario, c.check) == (model, scenario, check)),
            None,
        )


@dataclass
class SignoffReport:
    """What every renderer reads: the parity report and the sign-off's judgement of it."""

    parity: ParityReport
    signoff: Signoff
    # The newest quality reports of the signed-off models (harness/signoff/quality.py): shown
    # apart, never part of the verdict.
    quality: list[dict[str, Any]] = field(default_factory=list)
    # The newest conversion certificates (harness/signoff/certificate.py), and which models ask for one.
    certificates: list[dict[str, Any]] = field(default_factory=list)
    certified_models: list[str] = field(default_factory=list)
    # Branch coverage figures (make coverage's coverage.json; harness/branch_coverage.py), if given.
    coverage: dict[str, Any] | None = None
    # Fuzzing and mutation figures (harness/signoff/evidence.py), if given: shown, never judged.
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = self.parity.raw | {"signoff": asdict(self.signoff) | {"counts": self.signoff.counts}}
        if self.quality:
            out["quality_reports"] = [
                {"model": q["model"], "path": q["path"], "generated": q["generated"]} for q in self.quality
            ]
        if self.certified_models:
            out["conversion_certificates"] = [
                {k: c.get(k) for k in ("profile", "runtime", "verdict", "problems", "path", "generated")}
                for c in self.certificates
            ]
        if self.coverage:
            out["branch_coverage"] = self.coverage
        if self.evidence:
            out["evidence"] = self.evidence
        return out
