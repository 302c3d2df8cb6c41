"""`python -m harness twins [list | build TWIN_ID OUT_DIR]`: a thin face over build_twin."""

from __future__ import annotations

import argparse
import json
import sys
import time

from harness.artifacts.twins import TWINS, build_twin


def run(args: argparse.Namespace) -> int:

    if args.twins_command == "list":
        for twin_id, spec in sorted(TWINS.items()):
            print(f"{twin_id}\t{spec.description}")
        return 0
    started = time.perf_counter()
    try:
        identity = build_twin(args.twin_id, args.out_dir)
    except (ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - started
    size = sum(f["bytes"] for f in identity["files"].values())
    print(json.dumps({"id": identity["id"], "out_dir": str(args.out_dir), "bytes": size, "seconds": round(elapsed, 1)}))
    return 0
