"""`python -m harness.calibrate --model NAME [--write]`: derive an L2 token budget from the oracle
measured against itself under benign changes, and record the number with its derivation.

An L2 budget (the Whisper fast path's `composition.budget.max_differing_tokens`) says how many
tokens per clip may differ from the oracle. Its origin is measured, not chosen: the oracle
(mlx-whisper, in its venv: oracles/mlx-whisper/calibrate.py) transcribes each clip as the goldens
do and again under each benign change (compiled kernels off, a batch of two, float16 compute).
Per clip and change this counts the differing transcript tokens and explains the first divergence
of every decode call: the reference's logit gap between the two competing tokens against the
change's logit error on them (a near-tie when the error reaches the gap). The budget is the
largest count over clips and changes whose every divergence is a near-tie; a divergence that is
not one means the change was not benign, and calibration fails rather than widen a budget.

`--write` replaces the `budget:` line of each whisper-fast scenario in the profile with the
derived number and its origin (command, date, device, per-change figures).
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import HarnessError, OracleError
from harness.fileio import atomic_write_bytes
from harness.paths import REPO_ROOT, cache_root, oracles_dir
from harness.profile import Profile, find_profile, load_profile
from harness.provenance import device_facts
from harness.venvs import check_same_mlx, ensure_oracle_env

DEFAULT_VARIANTS = ("no-compile", "batch2")


def differing_tokens(a: list[int], b: list[int]) -> int:
    """Tokens that differ between two sequences once aligned: per replaced, inserted or deleted
    run, the longer side's length (a one-token flip counts 1; "dog" -> "dog." counts 1)."""
    count = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            count += max(i2 - i1, j2 - j1)
    return count


def first_divergences(
    ref_calls: list[dict[str, Any]], ref_rows: np.ndarray, var_calls: list[dict[str, Any]], var_rows: np.ndarray
) -> list[dict[str, Any]]:
    """Per decode call pair, the first step whose chosen token differs, with margin and error.

    Up to that step both runs were fed the same tokens, so their logits there are comparable.
    """
    out = []
    for index, (r, v) in enumerate(zip(ref_calls, var_calls, strict=False)):
        for step, (tr, tv) in enumerate(zip(r["chosen"], v["chosen"], strict=False)):
            if tr == tv:
                continue
            g = ref_rows[r["row_offset"] + step].astype(np.float64)
            a = var_rows[v["row_offset"] + step].astype(np.float64)
            gap = g[tr] - g[tv]
            error = abs((a[tr] - g[tr]) - (a[tv] - g[tv]))
            out.append(
                {
                    "decode_call": index,
                    "step": step,
                    "reference_token": tr,
                    "variant_token": tv,
                    "reference_gap": float(gap),
                    "logit_error": float(error),
                    "near_tie": bool(error >= abs(gap)),
                }
            )
            break
    return out


def max_logit_diff(
    ref_calls: list[dict[str, Any]], ref_rows: np.ndarray, var_calls: list[dict[str, Any]], var_rows: np.ndarray
) -> float:
    """Largest |logit difference| over the steps both runs computed on the same tokens: shows the
    change did move the bits (a change that moves nothing calibrates nothing)."""
    worst = 0.0
    for r, v in zip(ref_calls, var_calls, strict=False):
        for step, (tr, tv) in enumerate(zip(r["chosen"], v["chosen"], strict=False)):
            a = ref_rows[r["row_offset"] + step].astype(np.float64)
            b = var_rows[v["row_offset"] + step].astype(np.float64)
            finite = np.isfinite(a) & np.isfinite(b)
            worst = max(worst, float(np.max(np.abs(a[finite] - b[finite]), initial=0.0)))
            if tr != tv:
                break
    return worst


def _transcript_tokens(run: dict[str, Any]) -> list[int]:
    return [t for seg in run["transcript"]["segments"] for t in seg["tokens"]]


def summarize(result: dict[str, Any], out_dir: Path, variants: list[str]) -> dict[str, Any]:
    """Per variant and clip: differing tokens and first divergences; the derived budget."""
    table: dict[str, dict[str, Any]] = {}
    for clip, runs in result["clips"].items():
        ref = runs["reference"]
        ref_rows = np.load(out_dir / f"{clip}.reference.npy")
        for variant in variants:
            var = runs[variant]
            var_rows = np.load(out_dir / f"{clip}.{variant}.npy")
            table.setdefault(variant, {})[clip] = {
                "max_logit_diff": max_logit_diff(ref["decode_calls"], ref_rows, var["decode_calls"], var_rows),
                "differing_tokens": differing_tokens(_transcript_tokens(ref), _transcript_tokens(var)),
                "divergences": first_divergences(ref["decode_calls"], ref_rows, var["decode_calls"], var_rows),
                "same_text": ref["transcript"]["text"] == var["transcript"]["text"],
            }
    unexplained = [
        f"{variant}/{clip} decode call {d['decode_call']} step {d['step']} (gap {d['reference_gap']:.4g}, "
        f"error {d['logit_error']:.4g})"
        for variant, clips in table.items()
        for clip, row in clips.items()
        for d in row["divergences"]
        if not d["near_tie"]
    ]
    budget = max((row["differing_tokens"] for clips in table.values() for row in clips.values()), default=0)
    return {"table": table, "budget": budget, "unexplained": unexplained}


def run_oracle(profile: Profile, model_dir: Path, clips: list[tuple[str, str]], variants: list[str], out: Path):
    env = ensure_oracle_env(profile.oracle)
    check_same_mlx(env, device_facts().mlx)
    spec = {
        "model_dir": str(model_dir),
        "clips": [{"id": cid, "audio": str(REPO_ROOT / audio)} for cid, audio in clips],
        "options": dict(profile.defaults.options) | {"temperature": 0.0},
        "variants": variants,
    }
    spec_path = out / "spec.json"
    spec_path.write_text(json.dumps(spec))
    cmd, environ = env.command(
        str(oracles_dir() / profile.oracle / "calibrate.py"), "--spec", str(spec_path), "--out", str(out)
    )
    proc = subprocess.run(cmd, env=environ | {"HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise OracleError(f"calibration in the {profile.oracle} venv failed:\n{proc.stderr[-3000:]}")
    return json.loads((out / "result.json").read_text())


def origin_text(summary: dict[str, Any], command: str, clips: list[str]) -> str:
    parts = []
    for variant, rows in summary["table"].items():
        worst = max(rows.values(), key=lambda r: r["differing_tokens"])
        flips = sum(len(r["divergences"]) for r in rows.values())
        moved = max(r["max_logit_diff"] for r in rows.values())
        parts.append(
            f"{variant}: logits moved by up to {moved:.3g}, max {worst['differing_tokens']} differing tokens/clip, "
            f"{flips} first flips, all near-ties"
        )
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    return (
        f"calibrated {date} by `{command}` on {device_facts().key}: the oracle against itself over clips "
        f"{', '.join(clips)}; " + "; ".join(parts)
    )


def write_budget(profile: Profile, budget: int, origin: str) -> int:
    """Replace the one-line `budget: {...}` of every whisper-fast scenario; returns how many."""
    path = Path(profile.source_file)
    text = path.read_text()
    pattern = re.compile(r"^(\s*)budget: \{.*\}\s*$", re.MULTILINE)
    line = "budget: " + json.dumps({"max_differing_tokens": budget, "origin": origin})
    new, n = pattern.subn(lambda m: m.group(1) + line, text)
    expected = sum(1 for s in profile.scenarios if profile.intree_composition(s))
    if n != expected:
        raise HarnessError(
            f"{path}: found {n} one-line `budget: {{...}}` entries, the profile has {expected} whisper-fast "
            "scenarios: write each budget as one flow mapping line"
        )
    with tempfile.TemporaryDirectory() as tmp:  # the rewritten profile must still be valid
        (Path(tmp) / path.name).write_text(new)
        load_profile(Path(tmp) / path.name)
    atomic_write_bytes(path, new.encode())
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--clips", help="comma-separated scenario ids whose audio to use (default: every clip once)")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help="of no-compile, batch2, fp16")
    parser.add_argument("--write", action="store_true", help="write the derived budget into the profile")
    args = parser.parse_args(argv)
    try:
        from harness.artifacts import resolve_artifact

        profile = find_profile(args.model)
        if profile.implementation != "whisper":
            raise HarnessError(
                f"{profile.name}: calibration derives Whisper token budgets; this is {profile.implementation}"
            )
        wanted = set(args.clips.split(",")) if args.clips else None
        clips, seen = [], set()
        for s in profile.scenarios:
            if (wanted is None or s.id in wanted) and s.audio not in seen:
                clips.append((s.id, s.audio))
                seen.add(s.audio)
        if wanted is not None and len(clips) != len(wanted):
            raise HarnessError(f"--clips: unknown or duplicate-audio scenario ids in {sorted(wanted)}")
        variants = [v for v in args.variants.split(",") if v]
        model_dir = resolve_artifact(profile).model_dir
        (cache_root() / "tmp").mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="calibrate-", dir=cache_root() / "tmp") as tmp:
            result = run_oracle(profile, model_dir, clips, variants, Path(tmp))
            summary = summarize(result, Path(tmp), variants)
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for variant, rows in summary["table"].items():
        for clip, row in rows.items():
            flips = ", ".join(
                f"call {d['decode_call']} step {d['step']}: {d['reference_token']}->{d['variant_token']} "
                f"gap {d['reference_gap']:.4g} error {d['logit_error']:.4g} "
                + ("near-tie" if d["near_tie"] else "NOT a near-tie")
                for d in row["divergences"]
            )
            print(
                f"{variant:11} {clip:24} max |logit diff| {row['max_logit_diff']:.3g}  differing tokens "
                f"{row['differing_tokens']:3}  {flips or 'no flip'}"
            )
    if summary["unexplained"]:
        print("error: divergences that are not near-ties (the change is not benign):", file=sys.stderr)
        for line in summary["unexplained"]:
            print(f"  {line}", file=sys.stderr)
        return 1
    command = "python -m harness.calibrate " + " ".join(argv if argv is not None else sys.argv[1:])
    origin = origin_text(summary, command.replace(" --write", ""), [c for c, _ in clips])
    print(f"derived budget: {summary['budget']} differing tokens per clip\norigin: {origin}")
    if args.write:
        n = write_budget(profile, summary["budget"], origin)
        print(f"wrote the budget into {n} scenario(s) of {profile.source_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
