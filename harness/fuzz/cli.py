"""`python -m harness fuzz`: the command line of the differential fuzzer (harness/fuzz/run.py)."""

from __future__ import annotations

import argparse
import time

from harness.errors import HarnessError
from harness.fuzz.run import FuzzRun
from harness.paths import cache_root, reports_dir, shown

LIMITS = {"examples": (1, 100_000), "seed": (0, 2**32 - 1), "max_steps": (1, 64)}


def run(args: argparse.Namespace) -> int:
    """Exit 0: every example passed; 1: a finding (each written as a scenario); 2: bad input."""
    for name, (low, high) in LIMITS.items():
        value = getattr(args, name)
        if not low <= value <= high:
            print(f"error: --{name.replace('_', '-')} {value}: expected {low}..{high}")
            return 2
    hook = patch = None
    if args.mutant:
        from harness.tools.mutant_list import MUTANTS

        named = {m.name: m for m in MUTANTS}
        if args.mutant not in named:
            print(f"error: --mutant {args.mutant!r}: no such mutant (make mutants lists them: {', '.join(named)})")
            return 2
        hook, patch = named[args.mutant].hook, named[args.mutant].patch
    out = args.out or reports_dir() / f"fuzz-{args.model}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    if out.exists():
        print(f"error: --out {out}: exists; the fuzzer writes a new folder and never overwrites one")
        return 2
    fuzz = FuzzRun(
        args.model,
        args.examples,
        seed=args.seed,
        shrink=not args.no_shrink,
        database=None if args.no_database else cache_root() / "fuzz" / args.model,
        max_steps=args.max_steps,
        model_hook=hook,
        patch=patch,
    )
    try:
        fuzz.run()
    except HarnessError as e:
        print(f"error: {e}")
        return 2
    written = fuzz.write(out)
    stats = fuzz.stats.as_dict()
    print(
        f"fuzz {args.model}{f' under mutant {args.mutant}' if args.mutant else ''}: {stats['judged']} examples judged "
        f"({stats['passed']} passed) in {stats['seconds']} s, {stats['examples_per_second']} examples/s; "
        f"rejected: {sum(fuzz.stats.invalid.values())} invalid, {sum(fuzz.stats.oracle_refused.values())} the oracle "
        f"could not run"
    )
    for finding, path in zip(fuzz.findings.values(), written, strict=True):
        print(f"FOUND {finding.origin} (failing: {', '.join(finding.summaries)}): {shown(path)}")
    print(f"figures: {shown(out / 'fuzz.json')}")
    return 1 if fuzz.findings else 0
