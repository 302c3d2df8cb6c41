"""`python -m harness mutate`: automated mutation testing of the targets in mutation.yaml with
cosmic-ray (docs/mutants.md). Each module is mutated in a copy of the working tree and every
mutant judged by the target's runs; the figures go to <out>/mutate.json.

Exit 0: every mutant run and every survivor triaged; 1: a survivor not triaged, a stale triage
entry or a mutant not run; 2: bad input, or the tool or the unmutated run failed.
"""

from __future__ import annotations

import argparse
import time

from harness.errors import HarnessError
from harness.fileio import atomic_create_json
from harness.mutate import report
from harness.mutate.session import EXCLUDED_OPERATORS, Session
from harness.mutate.targets import load
from harness.paths import REPO_ROOT, reports_dir, shown


def run(args: argparse.Namespace) -> int:
    config_path = args.config or REPO_ROOT / "mutation.yaml"
    root = config_path.resolve().parent
    out = args.out or reports_dir() / f"mutate-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    if out.exists():
        print(f"error: --out {out}: exists; mutate writes a new folder and never overwrites one")
        return 2
    try:
        config = load(config_path, root)
        targets = config.select(args.module)
    except HarnessError as e:
        print(f"error: {e}")
        return 2
    if args.list:
        for target in targets:
            runs = " && ".join(" ".join(c[1:]) for c in target.commands("python"))
            print(f"{target.module}: {runs}")
        return 0
    results, started = [], time.perf_counter()
    for target in targets:
        start = time.perf_counter()
        try:
            unhashed = (config_path.resolve().relative_to(root).as_posix(),)
            session = Session(target, root, unhashed=unhashed)
            jobs = session.run()
        except HarnessError as e:
            print(f"error: {target.module}: {e}")
            return 2
        found = report.mutants(jobs, (root / target.module).read_text())
        result = report.judge(target, found, config.triage_of(target.module))
        print("\n".join(report.lines(result)), flush=True)
        results.append(result.as_dict() | {"seconds": round(time.perf_counter() - start, 1)})
    atomic_create_json(
        out / "mutate.json",
        {
            "tool": "cosmic-ray (harness/mutate/requirements.txt)",
            "excluded_operators": list(EXCLUDED_OPERATORS),
            "seconds": round(time.perf_counter() - started, 1),
            "modules": results,
        },
    )
    print(f"figures: {shown(out / 'mutate.json')}")
    clean = all(not (r["untriaged"] or r["stale_triage"] or r["not_run"]) for r in results)
    return 0 if clean else 1
