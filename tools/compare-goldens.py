#!/usr/bin/env python3
"""Compare every tracked golden manifest at a base revision with the working tree's.

For a change to oracle scripts that must not change what they compute (issue 32): the
goldens are regenerated (`make goldens`, `make vad ARGS=--update`) and this shows, manifest by
manifest, that nothing but the scripts' own identity moved. Every JSON field is compared;
differences are sorted into three kinds:

- `script`: the sha256 of the generator and of the oracles/common modules it loads (they are
  meant to change: that is why the goldens were regenerated);
- `when`: when, by which commit and on which machine it was generated (`generated_at`,
  `harness_commit`, `recorded_on`, an environment's `platform` string) and how long the
  package took (a VAD golden's `seconds`);
- `derived`: a compact golden's `logsumexp` that moved by one float64 ULP. The harness derives it
  from the oracle's float32 row (harness/records.py) with numpy's exp, whose SIMD path differs
  between CPUs (AVX2 and AVX-512 give one ULP apart); the row itself is judged by its hash. Two
  ULPs or more is BITS;
- `BITS`: anything else (blob and row hashes, tokens, texts, segments, versions, spec). A
  non-finite number written as a bare token or as the string the harness writes now
  ("-Infinity") is the same value.

Exit 0 when no manifest has a BITS difference and none went missing; 1 otherwise.

Usage: python3 tools/compare-goldens.py [--base REV] [--quiet]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT_KEYS = ("generator_sha256", "common_sha256")
WHEN_KEYS = ("generated_at", "harness_commit", "recorded_on", "platform", "seconds")


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout


def differences(old, new, path=""):
    """(path, kind) for every leaf that differs."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            where = f"{path}.{key}" if path else key
            if key in SCRIPT_KEYS:
                if old.get(key) != new.get(key):
                    out.append((where, "script"))
            elif key not in old or key not in new:
                out.append((where, "when" if key in WHEN_KEYS else "BITS"))
            elif key in WHEN_KEYS:
                if old[key] != new[key]:
                    out.append((where, "when"))
            else:
                out += differences(old[key], new[key], where)
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True)) for d in differences(a, b, f"{path}[{i}]")]
    old, new = _as_written(old), _as_written(new)
    if old == new and type(old) is type(new):
        return []
    return [(path or "(whole)", "derived" if _one_ulp_logsumexp(path, old, new) else "BITS")]


def _one_ulp_logsumexp(path: str, old, new) -> bool:
    if ".logsumexp[" not in path or not all(isinstance(v, float) and math.isfinite(v) for v in (old, new)):
        return False
    return math.nextafter(old, new) == new


def _as_written(value):
    """A non-finite float as the harness writes it now, a string (harness/fileio.py): manifests
    written before hold bare `-Infinity`, which reads back as the same value."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="the revision whose manifests are the reference (HEAD)")
    parser.add_argument("--quiet", action="store_true", help="print only the manifests with a BITS difference")
    args = parser.parse_args()
    files = [f for f in git("ls-tree", "-r", "--name-only", args.base, "--", "goldens").split() if f.endswith(".json")]
    counts = {"same": 0, "script": 0, "BITS": 0, "missing": 0, "derived": 0}
    for name in files:
        old = json.loads(git("show", f"{args.base}:{name}"))
        path = REPO / name
        if not path.is_file():
            counts["missing"] += 1
            print(f"MISSING {name}")
            continue
        found = differences(old, json.loads(path.read_text()))
        bits = [p for p, kind in found if kind == "BITS"]
        script = sorted({p for p, kind in found if kind == "script"})
        derived = [p for p, kind in found if kind == "derived"]
        if derived:
            counts["derived"] += 1
            print(f"derived {name}: logsumexp one float64 ULP apart at {', '.join(derived[:4])}")
        if bits:
            counts["BITS"] += 1
            print(f"BITS    {name}: {', '.join(bits[:8])}{' ...' if len(bits) > 8 else ''}")
        elif script:
            counts["script"] += 1
            if not args.quiet:
                print(f"same    {name} (script hashes changed: {', '.join(script)})")
        else:
            counts["same"] += 1
            if not args.quiet:
                print(f"same    {name}")
    print(
        f"{len(files)} manifests at {args.base}: {counts['same'] + counts['script']} compute the same "
        f"({counts['script']} with new script hashes; {counts['derived']} with a logsumexp one ULP apart), "
        f"{counts['BITS']} differ, {counts['missing']} missing"
    )
    return 0 if counts["BITS"] == 0 and counts["missing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
