"""Command line: `python -m harness <verb>`, every face of the harness (the Makefile's targets
call these): parity, goldens, compact-goldens, signoff and list here; the tools beside the gate
(bench, bench-compiled, bench-kv, bench-whisper, calibrate, mutants, vad, twins, portability,
quality) parse their own arguments."""

from __future__ import annotations

import argparse
import importlib
import sys

from harness.errors import HarnessError
from harness.paths import REPO_ROOT, profiles_dir
from harness.settings import check_all as check_settings

# verb -> (module with main(argv), what it does)
TOOLS = {
    "bench": ("harness.tools.bench", "in-tree vs mlx-lm decode speed, and the harness's own overhead"),
    "bench-compiled": ("harness.tools.bench_compiled", "compiled vs eager vs mlx-lm decode (--gate: judge it)"),
    "bench-kv": ("harness.tools.bench_kv", "KV cache memory and speed per configuration, L1 vs L2, in-tree vs oracle"),
    "bench-whisper": ("harness.tools.bench_whisper", "Whisper real-time factor against mlx-whisper"),
    "calibrate": ("harness.tools.calibrate", "the Whisper fast path's L2 budget and per-step bounds (--write)"),
    "mutants": ("harness.tools.mutants", "inject known faults into the in-tree models; each must be caught"),
    "vad": ("harness.tools.vad", "Silero VAD against the silero-vad package, printed per fixture"),
    "twins": ("harness.artifacts.twins.__main__", "list or build the deterministic twin models"),
    "portability": ("harness.portability", "resolve every pin file for Linux and macOS runners, without installing"),
    "quality": ("harness.quality.cli", "quantization quality of a profile's pairs against their controls"),
}


def _parity(args: argparse.Namespace, extra: list[str]) -> int:
    import pytest

    # The plugin is named explicitly: profiles may live outside the repo (MLX_PARITY_PROFILES).
    pytest_args = [
        str(profiles_dir()),
        "-p",
        "harness.pytest_plugin",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rN",
        f"--rootdir={REPO_ROOT}",
    ]
    for model in args.model:
        pytest_args += ["--model", model]
    if args.report:
        pytest_args += ["--parity-report", args.report]
    if args.workers:
        pytest_args += ["-n", args.workers, "--dist", "loadgroup"]
    if extra[:1] == ["--"]:
        extra = extra[1:]
    return int(pytest.main(pytest_args + extra))


def _goldens(args: argparse.Namespace) -> int:
    from harness.profile.vad import available_vad_profiles
    from harness.session import ParitySession
    from harness.tools.vad import run_gate

    session = ParitySession()
    failed = 0
    for name in args.model:
        if name in available_vad_profiles():  # a VAD profile: every fixture's golden, regenerated
            if args.oracle:
                raise SystemExit(f"{name}: a VAD profile has one oracle; --oracle does not apply")
            for verdict in run_gate(update=True):
                print(f"{name}/{verdict.fixture}: {verdict.chunks} chunks")
            continue
        profile = session.profile(name)
        ids = {s.id for s in profile.scenarios}  # nightly ones too
        if args.oracle:
            unknown = set(args.oracle) - {profile.oracle_of(s) for s in profile.scenarios}
            if unknown:
                raise SystemExit(f"{name}: no scenario uses oracle(s) {sorted(unknown)}")
            ids = {s.id for s in profile.scenarios if profile.oracle_of(s) in args.oracle}
        session.selected_scenarios[profile.name] = ids
        goldens = session.goldens(profile, regenerate=True)
        for sid, golden in goldens.items():
            print(f"{name}/{sid}: {len(golden.record.tokens)} steps -> {golden.manifest_path}")
        for (model, sid), error in session.scenario_errors(profile.name).items():
            print(f"error: {model}/{sid}: no golden: {error}", file=sys.stderr)
            failed += 1
    if failed:
        print(f"error: {failed} scenario(s) could not be generated (the others were written)", file=sys.stderr)
    return 1 if failed else 0


def _compact(args: argparse.Namespace) -> int:
    """Rewrite this device's full goldens as compact ones (hashes, top-k, logsumexp)."""
    from harness.profile.load import available_profiles
    from harness.session import ParitySession

    session = ParitySession()
    total_before = total_after = 0
    for name in args.model or list(available_profiles()):
        profile = session.profile(name)
        top_k, full_steps = profile.golden.compact or (8, 2)
        for scenario in profile.scenarios:
            store = session.store(profile.oracle_of(scenario))
            if store.read_manifest(profile.name, scenario.id) is None:
                continue
            out = store.compact_existing(profile.name, scenario.id, top_k, full_steps)
            if out is None:
                print(f"{name}/{scenario.id}: already compact")
                continue
            total_before += out["before_bytes_per_step"] * out["rows"]
            total_after += out["after_bytes_per_step"] * out["rows"]
            print(
                f"{name}/{scenario.id}: {out['rows']} steps, {out['before_bytes_per_step']} -> "
                f"{out['after_bytes_per_step']} bytes per golden step"
            )
    print(f"total: {total_before} -> {total_after} bytes")
    return 0


def _list(args: argparse.Namespace) -> int:
    from harness.profile.load import available_profiles, load_profile, nightly_models

    if args.nightly or args.names:
        print("\n".join(nightly_models() if args.nightly else available_profiles()))
        return 0
    for name, path in available_profiles().items():
        try:
            p = load_profile(path)
            tiers = {}
            for s in p.scenarios:
                key = f"{p.tier_of(s)}:{p.oracle_of(s)}"
                tiers[key] = tiers.get(key, 0) + 1
            judged = ", ".join(f"{k} x{n}" for k, n in tiers.items())
            print(f"{name:28} {judged:34} {p.description}")
        except HarnessError as e:
            print(f"{name:24} INVALID: {e}")
    from harness.profile.vad import VAD_TIER, available_vad_profiles, load_vad_profile

    for name, path in available_vad_profiles().items():
        try:
            v = load_vad_profile(path)
            judged = f"{VAD_TIER}:{v.oracle} x{len(v.fixtures)}"
            print(f"{name:28} {judged:34} voice activity (profiles/vad/{path.name})")
        except HarnessError as e:
            print(f"{name:24} INVALID: {e}")
    return 0


def _settings(args: argparse.Namespace) -> int:
    from harness import settings
    from harness.fileio import atomic_write_bytes

    text = settings.reference_markdown()
    if args.write:
        atomic_write_bytes(settings.REFERENCE, text.encode())
        print(f"wrote {settings.REFERENCE.relative_to(REPO_ROOT)}")
    else:
        sys.stdout.write(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        check_settings()  # a bad MLX_PARITY_* value stops every verb before it starts
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if argv and argv[0] in TOOLS:
        return int(importlib.import_module(TOOLS[argv[0]][0]).main(argv[1:]))
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for verb, (_, what) in TOOLS.items():
        sub.add_parser(verb, help=what, add_help=False)
    p = sub.add_parser("parity", help="gate models against their oracles (pytest underneath)")
    p.add_argument("--model", action="append", default=[], help="profile name (repeatable); default: all")
    p.add_argument("--report", help="JSON report path (default: a new file under reports/)")
    p.add_argument("-n", "--workers", help="pytest-xdist workers (e.g. auto)")
    g = sub.add_parser("goldens", help="(re)generate a model's goldens with its oracle, explicitly")
    g.add_argument("--model", action="append", required=True)
    g.add_argument("--oracle", action="append", default=[], help="only the scenarios this oracle judges")
    c = sub.add_parser("compact-goldens", help="rewrite this device's full goldens as compact ones")
    c.add_argument("--model", action="append", default=[])
    ls = sub.add_parser("list", help="list profiles")
    ls.add_argument("--names", action="store_true", help="only the names, one per line")
    ls.add_argument("--nightly", action="store_true", help="only the names `make nightly` runs, one per line")
    s = sub.add_parser("settings", help="the environment variables the harness reads (docs/settings.md)")
    s.add_argument("--write", action="store_true", help="rewrite docs/settings.md from the table")
    from harness.signoff.args import add_arguments as add_signoff_arguments

    add_signoff_arguments(sub.add_parser("signoff", help="run every profile and write a sign-off report directory"))
    args, extra = parser.parse_known_args(argv)
    try:
        if args.command == "parity":
            return _parity(args, extra)
        if args.command == "signoff":
            from harness.signoff.cli import main as signoff

            return signoff(args, extra)
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        if args.command == "goldens":
            return _goldens(args)
        if args.command == "compact-goldens":
            return _compact(args)
        if args.command == "settings":
            return _settings(args)
        return _list(args)
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
