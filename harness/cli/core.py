"""The verbs that are the gate itself: parity, goldens, compact-goldens, list and settings
(their arguments are declared in harness/cli/verbs.py)."""

from __future__ import annotations

import argparse
import sys

from harness.errors import HarnessError
from harness.paths import REPO_ROOT


def parity(args: argparse.Namespace) -> int:
    import pytest

    from harness.cli.select import pytest_arguments
    from harness.oracle.installed import check_interpreter

    check_interpreter()  # the in-tree implementations compute with this interpreter's mlx
    return int(pytest.main(pytest_arguments(args)))


def goldens(args: argparse.Namespace) -> int:
    from harness.device import check_real_device
    from harness.profile.vad import available_vad_profiles
    from harness.provenance import device_facts
    from harness.session import ParitySession
    from harness.tools.vad import run_gate

    check_real_device(device_facts())  # no Metal golden made on a paravirtual GPU
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


def compact(args: argparse.Namespace) -> int:
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


def list_profiles(args: argparse.Namespace) -> int:
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


def settings(args: argparse.Namespace) -> int:
    from harness import settings
    from harness.fileio import atomic_write_bytes

    text = settings.reference_markdown()
    if args.write:
        atomic_write_bytes(settings.REFERENCE, text.encode())
        print(f"wrote {settings.REFERENCE.relative_to(REPO_ROOT)}")
    else:
        sys.stdout.write(text)
    return 0
