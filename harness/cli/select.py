"""What a parity run selects and where it writes: `--scenario`/`--check` as pytest node ids
(the ids `--collect-only` prints and a failure's rerun command names), and the run's report
paths (the JSON report and its JUnit file share one stem)."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

from harness.errors import HarnessError, UsageError, unknown
from harness.paths import REPO_ROOT, cache_root, profiles_dir, reports_dir


def pytest_arguments(args: argparse.Namespace) -> list[str]:
    """pytest's command line for `python -m harness parity` (`args.extra` passed through last)."""
    ids = [_resolved(i) for i in node_ids(args.model, args.scenario, args.check)]  # a usage error names what is known
    extra = [_resolved(a) if ".yaml" in a and not a.startswith("-") else a for a in args.extra]
    collect_only = any(a in ("--collect-only", "--co") for a in extra)
    targets = ids + [a for a in extra if ".yaml" in a and not a.startswith("-")]
    # The plugin is named explicitly: profiles may live outside the repo (MLX_PARITY_PROFILES).
    # pytest's cache (--lf, --ff) lives in the harness's cache, never beside the profiles.
    out = [] if targets else [str(profiles_dir())]
    # First of the plugins: with MLX_PARITY_COVERAGE set it records models/' branch coverage from
    # before any model module is imported, in the xdist workers too (harness/branch_coverage.py).
    out += ids + ["-p", "harness.branch_coverage_plugin", "-p", "harness.pytest_plugin"]
    out += ["-q", "-rN", "--tb=no", f"--rootdir={node_root()}"]
    out += ["-o", f"cache_dir={cache_root() / 'pytest'}", "-o", "console_output_style=count"]
    for model in args.model:
        out += ["--model", model]
    if not collect_only:
        report, junit = run_paths(args.model, args.report)
        out += ["--parity-report", str(report)]
        writable = junit.parent.is_dir() or not junit.parent.exists()  # else the report's own error names it
        if writable and not any(a.startswith(("--junitxml", "--junit-xml")) for a in extra):
            out += [f"--junitxml={junit}"]
    if args.workers:
        out += ["-n", args.workers, "--dist", "loadgroup"]
    return out + extra


def node_root() -> Path:
    """What node ids are relative to (pytest's rootdir): the repo, or the folder holding the
    profiles folder when it lies outside the repo (MLX_PARITY_PROFILES), so that collecting the
    folder and naming one file give the same ids."""
    profiles = profiles_dir().resolve()
    return REPO_ROOT if profiles.is_relative_to(REPO_ROOT) else profiles.parent


def _resolved(node: str) -> str:
    """A node id as pytest printed it, made absolute when it is not a path from here."""
    path, _, rest = node.partition("::")
    if Path(path).exists() or not (node_root() / path).exists():
        return node
    return str(node_root() / path) + ("::" + rest if rest else "")


def _profile_path(model: str) -> Path:
    from harness.pytest_plugin import known_models

    known = known_models()
    if model not in known:
        raise UsageError(unknown(model, known, "model", "known models"))
    return known[model]


def node_id(path: Path, *parts: str) -> str:
    """`profiles/<model>.yaml::<scenario>::<check>`, as pytest prints it (relative to `node_root`)."""
    return "::".join((str(path.resolve().relative_to(node_root())), *parts))


def _scenarios_and_checks(model: str, path: Path) -> dict[str, list[str]]:
    from harness.profile.load import available_profiles, load_profile
    from harness.profile.vad import load_vad_profile

    if model in available_profiles():
        profile = load_profile(path)
        return {s.id: list(profile.planned(s).checks) for s in profile.scenarios}
    from harness.checks.vad import vad_checks

    vad = load_vad_profile(path)
    return {fixture: list(vad_checks(vad)) for fixture in vad.fixtures}


def node_ids(models: list[str], scenarios: list[str], checks: list[str]) -> list[str]:
    """The node ids of `--scenario` (and `--check` within it) on one model; none when neither is given."""
    if not scenarios and not checks:
        return []
    if checks and not scenarios:
        raise UsageError("--check (CHECK=) names a check of a scenario: give --scenario (SCENARIO=) too, or -k CHECK")
    if len(models) != 1:
        raise UsageError(f"--scenario (SCENARIO=) selects within one model; got {len(models)}: give one --model")
    path = _profile_path(models[0])
    try:
        plan = _scenarios_and_checks(models[0], path)
    except HarnessError as e:
        raise UsageError(f"{models[0]}: {e}") from None
    ids = []
    for scenario in scenarios:
        if scenario not in plan:
            raise UsageError(unknown(scenario, plan, f"scenario of {models[0]}", "its scenarios"))
        if not checks:
            ids.append(node_id(path, scenario))
        for check in checks:
            if check not in plan[scenario]:
                raise UsageError(unknown(check, plan[scenario], f"check of {models[0]}/{scenario}", "its checks"))
            ids.append(node_id(path, scenario, check))
    return ids


def run_paths(models: list[str], report: str | None) -> tuple[Path, Path]:
    """The JSON report (`--report`, else a new name under reports/) and the JUnit file beside it."""
    if report:
        path = Path(report)
    else:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        path = reports_dir() / f"parity-{'-'.join(sorted(models)) or 'all'}-{stamp}.json"
    junit = path.with_name(path.stem + ".junit.xml")
    if junit.exists():
        raise UsageError(f"the JUnit file {junit} exists and is never replaced: name a new --report")
    return path, junit
