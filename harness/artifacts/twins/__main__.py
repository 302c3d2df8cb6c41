"""`python -m harness twins [list | build TWIN_ID OUT_DIR]`: a thin face over build_twin."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from harness.artifacts.twins import TWINS, build_twin


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness twins", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the registered twins")
    build = commands.add_parser("build", help="build one twin into an absent or empty directory")
    build.add_argument("twin_id", help=f"one of {', '.join(sorted(TWINS))}")
    build.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)

    if args.command == "list":
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


if __name__ == "__main__":
    sys.exit(main())
