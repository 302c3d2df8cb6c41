"""`python -m harness signoff`: run parity for every profile, judge, render, write the directory.

The parity run is the ordinary `python -m harness parity`, one child process per profile,
each writing its JSON report to a temporary path; the reports are merged into one. The
sign-off adds no second way of running checks, only a reader of their results.
`--from-report` skips the run and signs off an existing report.
Exit codes: 0 SIGNED OFF, 1 BLOCKED, 2 a harness error (bad waivers file, no report),
3 INCOMPLETE (nothing blocks, but checks of the requested profiles did not run: `-- -k ...`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness.branch_coverage import read_figures
from harness.cli.select import run_paths
from harness.errors import HarnessError
from harness.history.store import record, store_path
from harness.paths import REPO_ROOT, reports_dir
from harness.profile.load import available_profiles, find_profile
from harness.progress import progress
from harness.report import merge_reports
from harness.signoff.certificate import latest_certificates
from harness.signoff.evidence import read_fuzz, read_mutate
from harness.signoff.junit import render_junit
from harness.signoff.model import INCOMPLETE, SIGNED_OFF, ParityReport, SignoffReport, check_id
from harness.signoff.page import render_page
from harness.signoff.plots import scenario_plots
from harness.signoff.quality import latest_quality_reports
from harness.signoff.summary import render_summary
from harness.signoff.verdict import evaluate
from harness.signoff.waivers import Waiver, load_waivers
from harness.signoff.writer import find_previous, load_previous, signoff_name, write_signoff_dir


def main(args: argparse.Namespace) -> int:
    extra = args.extra
    waivers = load_waivers(Path(args.waivers) if args.waivers else REPO_ROOT / "waivers.yaml")  # fail fast
    if args.coverage:
        read_figures(Path(args.coverage))  # fail fast too
    evidence = {
        "fuzz": read_fuzz(Path(args.fuzz)) if args.fuzz else None,
        "mutate": read_mutate(Path(args.mutate)) if args.mutate else None,
    }
    if args.from_report:
        if extra:
            raise HarnessError(f"--from-report runs nothing: unexpected parity arguments {extra}")
        report = ParityReport.load(Path(args.from_report))
        # The run's own exit status, where the report records it (a crash outside any check).
        exit_code = report.context.get("exit_status")
        machine = (report.signoff or {}).get("machine") or machine_facts() | {"source": "rendering host"}
        requested = args.model or sorted({r.model for r in report.results})
    else:
        requested = args.model or _all_profiles()
        report, exit_code = run_parity(requested, args.workers, extra)
        machine = machine_facts()
    directory, doc = sign_off(
        report,
        waivers,
        out=Path(args.out) if args.out else reports_dir(),
        previous=Path(args.previous) if args.previous else None,
        exclude_previous=Path(args.from_report) if args.from_report else None,
        requested_models=requested,
        parity_exit_code=exit_code,
        machine=machine,
        coverage=read_figures(Path(args.coverage)) if args.coverage else None,
        evidence=evidence,
    )
    s = doc.signoff
    print(f"sign-off: {s.verdict} ({', '.join(f'{k} {n}' for k, n in s.counts.items())})")
    for b in s.blockers[:20]:
        print(f"  blocking {b.kind} {b.subject}: {b.headline}")
    if len(s.blockers) > 20:
        print(f"  ... and {len(s.blockers) - 20} more (see summary.md)")
    if s.not_run:
        print(
            f"  not run: {s.not_run_line()}: deselected (pytest -k / -m) or absent from the report; "
            "no sign-off of the profiles until every check runs"
        )
        for cid in s.not_run[:10]:
            print(f"    {cid}")
        if len(s.not_run) > 10:
            print(f"    ... and {len(s.not_run) - 10} more (summary.md lists every one)")
    print(f"sign-off written: {directory}/index.html")
    if not args.from_report:  # a sign-off of its own runs: its line in the results store too
        record(store_path(), "signoff", report.raw | {"verdict": s.verdict}, directory / "report.json")
    return EXIT_CODES.get(s.verdict, 1)


EXIT_CODES = {SIGNED_OFF: 0, INCOMPLETE: 3}  # BLOCKED (or anything else): 1


def sign_off(
    report: ParityReport,
    waivers: list[Waiver],
    *,
    out: Path,
    previous: Path | None = None,
    exclude_previous: Path | None = None,
    requested_models: list[str] | None = None,
    parity_exit_code: int | None = None,
    machine: dict[str, str] | None = None,
    today: dt.date | None = None,
    coverage: dict[str, Any] | None = None,
    evidence: dict[str, Any] | None = None,
) -> tuple[Path, SignoffReport]:
    """Judge a parity report and write its sign-off directory under `out`; the one entry point."""
    now = dt.datetime.now(dt.UTC)
    previous = previous or find_previous(out, report.device_key, exclude=exclude_previous)
    judged = requested_models or sorted({r.model for r in report.results})
    signoff = evaluate(
        report,
        waivers,
        today=today or now.date(),  # waivers expire by the UTC calendar, the same on every runner
        generated=now.isoformat(timespec="milliseconds"),
        requested_models=requested_models,
        parity_exit_code=parity_exit_code,
        machine=machine,
        previous=(str(previous), load_previous(previous)) if previous else None,
        expected=profile_check_ids(judged, report.device.get("backend")),
    )
    models = sorted(set(signoff.models) | set(requested_models or []))
    certified = [m for m in models if m in available_profiles() and find_profile(m).certificate is not None]
    doc = SignoffReport(
        report,
        signoff,
        quality=latest_quality_reports(out, signoff.device_key, models),
        certificates=latest_certificates(out, signoff.device_key, certified),
        certified_models=certified,
        coverage=coverage,
        evidence={k: v for k, v in (evidence or {}).items() if v},
    )
    directory = write_signoff_dir(out, signoff_name(signoff.harness_version, signoff.device_key), render(doc))
    return directory, doc


def profile_check_ids(models: list[str], backend: str | None) -> list[str]:
    """Every check id these profiles collect on `backend` (the report's; default this host's):
    what a complete sign-off of them judges, enumerated as collection does (harness/pytest_items.py):
    per model profile, each scenario the backend runs times its checks; per VAD profile, each
    fixture times its checks. A profile that does not load adds nothing here (its run has an
    ERROR row for it), nor does a name that is no profile (without results it blocks as missing).
    """
    from harness.checks.vad import vad_checks
    from harness.profile.load import available_profiles, load_profile
    from harness.profile.vad import available_vad_profiles, load_vad_profile
    from harness.provenance import device_facts

    profiles, vad_profiles = available_profiles(), available_vad_profiles()
    ids: list[str] = []
    for name in models:
        try:
            if name in profiles:
                p = load_profile(profiles[name])
                backend = backend or device_facts().backend
                ids += [check_id(p.name, s.id, c) for s in p.active_scenarios(backend) for c in p.checks(s)]
            elif name in vad_profiles:
                v = load_vad_profile(vad_profiles[name])
                ids += [check_id(v.name, str(f), c) for f in v.fixtures for c in vad_checks(v)]
        except (HarnessError, OSError, ValueError):  # the run reports a profile that does not load
            continue
    return ids


def render(doc: SignoffReport) -> dict[str, bytes]:
    return {
        "index.html": render_page(doc, scenario_plots(doc.parity.results)).encode(),
        "summary.md": render_summary(doc).encode(),
        "report.json": (json.dumps(doc.to_json(), indent=2, sort_keys=True) + "\n").encode(),
        "junit.xml": render_junit(doc),
    }


def run_parity(models: list[str], workers: str | None, extra: list[str]) -> tuple[ParityReport, int]:
    """`python -m harness parity` once per profile, each in its own child process; reports merged.

    One process per profile keeps the peak memory that of the largest profile: a process
    does not hand back all it allocated (mlx's allocator, earlier records), so profiles run
    one after another in one process would stack. The merged report is the sign-off's only
    input; its context names every run's exit code. The exit code returned is the worst one:
    any code other than 0 (all passed) and 1 (a check failed) wins over those two.
    """
    reports, runs = [], {}
    # Each run's report is kept under reports/, where its own last screen says it is.
    for i, model in enumerate(models, 1):
        report_path = run_paths([model], None)[0]
        command = [sys.executable, "-m", "harness", "parity", "--report", str(report_path), "--model", model]
        if workers:
            command += ["-n", workers]
        if extra:
            command += ["--", *(extra[1:] if extra[0] == "--" else extra)]
        progress.say(f"sign-off: running parity for {model} ({i}/{len(models)}, its own process)")
        runs[model] = subprocess.run(command, cwd=REPO_ROOT, check=False).returncode
        if report_path.exists():
            reports.append(json.loads(report_path.read_text()))
        else:
            progress.say(f"sign-off: the parity run of {model} (exit code {runs[model]}) wrote no report")
    if not reports:
        codes = ", ".join(f"{m} {c}" for m, c in runs.items())
        raise HarnessError(f"no parity run wrote a report (exit codes: {codes}): nothing to sign off")
    merged = ParityReport.from_dict(merge_reports(reports, runs), "the merged parity report")
    return merged, worst_exit_code(runs.values())


def worst_exit_code(codes) -> int:
    codes = list(codes)
    odd = [c for c in codes if c not in (0, 1)]
    return odd[0] if odd else max(codes, default=0)


def _all_profiles() -> list[str]:
    from harness.pytest_plugin import known_models

    return sorted(known_models())


def machine_facts() -> dict[str, str]:
    """Who ran it, beyond the device facts the parity report already has."""
    facts = {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": str(os.cpu_count()),
    }
    try:
        facts["memory_gb"] = f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / (1 << 30):.1f}"
    except (ValueError, OSError, AttributeError):
        pass
    if sys.platform == "darwin":
        chip = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True)
        facts["chip"] = chip.stdout.strip()
        facts["macos"] = platform.mac_ver()[0]
    return facts
