"""The judgement: every check's status, the waivers' use, and SIGNED OFF or BLOCKED with why.

The rules, in one place:
- a passed check is PASS; a failed or erroring one is FAIL / ERROR, or WAIVED when an
  unexpired waiver matches it;
- an expired waiver blocks, whatever it matches (and waives nothing);
- a requested model without a single result blocks (its profile did not even collect),
  unless no scenario of it runs on this backend: that one is listed as not run here;
- a parity run that exited abnormally (pytest's 2..5), or with 1 while every check passed,
  blocks: something outside the checks went wrong. A sign-off runs one parity process per
  profile (the report's `runs`), and each run's code is judged with that profile's checks;
- no results at all block;
- unblocked, the sign-off is INCOMPLETE when a check that the requested profiles collect on
  this backend has no result (deselected with `-- -k` / `-m`, or absent from a report signed
  off later): a partial run is never a sign-off of the profiles. Anything else is SIGNED OFF.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from harness.signoff.diff import diff_reports
from harness.signoff.headline import headline
from harness.signoff.model import (
    BLOCKED,
    INCOMPLETE,
    SIGNED_OFF,
    Blocker,
    CheckStatus,
    ParityReport,
    Signoff,
    WaiverUse,
    check_id,
)
from harness.signoff.waivers import Waiver


def evaluate(
    report: ParityReport,
    waivers: list[Waiver],
    *,
    today: dt.date,
    generated: str,
    requested_models: list[str] | None = None,
    parity_exit_code: int | None = None,
    machine: dict[str, str] | None = None,
    previous: tuple[str, ParityReport] | None = None,
    expected: list[str] | None = None,
) -> Signoff:
    """`expected`: every check id the requested profiles collect on this backend (None: unknown)."""
    active = [w for w in waivers if not w.expired(today)]
    checks: list[CheckStatus] = []
    for r in report.results:
        cid = check_id(r.model, r.scenario, r.check)
        status, waiver = {"passed": "PASS", "failed": "FAIL"}.get(r.outcome, "ERROR"), None
        if status != "PASS":
            waiver = next((w.check for w in active if w.matches(cid)), None)
            status = "WAIVED" if waiver else status
        checks.append(
            CheckStatus(
                id=cid,
                model=r.model,
                scenario=r.scenario,
                check=r.check,
                tier=r.tier,
                outcome=r.outcome,
                status=status,
                summary=r.summary,
                seconds=r.seconds,
                peak_rss_mb=r.peak_rss_mb,
                first_bad_step=r.first_bad_step,
                waiver=waiver,
                headline="" if status == "PASS" else headline(r),
            )
        )
    uses = [
        WaiverUse(
            check=w.check,
            reason=w.reason,
            owner=w.owner,
            expires=w.expires.isoformat(),
            state="expired" if w.expired(today) else "active",
            matched=[c.id for c in checks if w.matches(c.id)],
            waived=[c.id for c in checks if c.waiver == w.check],
        )
        for w in waivers
    ]
    runs = report.context.get("runs") or {}
    not_run_here = sorted(set(report.context.get("not_run_here") or []) & set(requested_models or []))
    judged = [m for m in requested_models or [] if m not in not_run_here]
    blockers = _blockers(checks, uses, judged, parity_exit_code, runs)
    ran = {c.id for c in checks}
    expected = list(dict.fromkeys(expected or []))
    not_run = [cid for cid in expected if cid not in ran]
    return Signoff(
        verdict=BLOCKED if blockers else INCOMPLETE if not_run else SIGNED_OFF,
        generated=generated,
        harness_version=report.harness_version,
        device_key=report.device_key,
        requested_models=sorted(requested_models or {c.model for c in checks}),
        parity_exit_code=parity_exit_code,
        machine=machine or {},
        checks=checks,
        blockers=blockers,
        waivers=uses,
        diff=diff_reports(report, previous[1], previous[0]) if previous else None,
        not_run_here=not_run_here,
        expected_checks=len(expected),
        not_run=not_run,
    )


def _blockers(
    checks: list[CheckStatus],
    waivers: list[WaiverUse],
    requested_models: list[str],
    exit_code: int | None,
    runs: dict[str, int] | None = None,
) -> list[Blocker]:
    blockers = [
        Blocker("check", c.id, f"{c.status}: {c.summary}", f"{c.status}: {c.headline}")
        for c in checks
        if c.status in ("FAIL", "ERROR")
    ]
    for w in waivers:
        if w.state == "expired":
            matched = f"; it matches {len(w.matched)} check(s) of this run" if w.matched else ""
            blockers.append(
                Blocker("waiver", w.check, f"waiver expired on {w.expires} (owner {w.owner}): renew or remove{matched}")
            )
    ran = {c.model for c in checks}
    for model in requested_models:
        if model not in ran:
            blockers.append(Blocker("model", model, "no check of this model ran (profile or collection error?)"))
    if not checks:
        blockers.append(Blocker("run", "parity", "no checks ran"))
    if runs:  # one parity run per profile: each run's exit code is judged with its own checks
        for model, code in runs.items():
            own = [c for c in checks if c.model == model]
            if code not in (0, 1):
                blockers.append(Blocker("run", model, f"its parity run exited with code {code}"))
            elif code == 1 and all(c.outcome == "passed" for c in own):
                blockers.append(
                    Blocker("run", model, "its parity run failed (exit code 1) although every check passed")
                )
    elif exit_code not in (None, 0, 1):
        blockers.append(Blocker("run", "parity", f"the parity run exited with code {exit_code}"))
    elif exit_code == 1 and all(c.outcome == "passed" for c in checks):
        blockers.append(Blocker("run", "parity", "the parity run failed (exit code 1) although every check passed"))
    # Every other kind's reason is one short line already: it is its own headline.
    return [b if b.headline else replace(b, headline=b.reason) for b in blockers]
