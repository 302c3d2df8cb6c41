"""`python -m harness calibrate --model NAME [--write]`: calibrate the L2 fast-path gate: a token
budget from the oracle measured against itself under benign changes, and a per-step logit-error
bound from the fast path measured against the oracle's golden; `--write` records both.

Budget. The oracle (mlx-whisper, in its venv: oracles/mlx-whisper/calibrate.py) transcribes
each clip as the goldens do and again under each benign change (compiled kernels off, a batch
of two, float16 compute). Per clip and change this counts the differing transcript tokens and
explains the first divergence of every decode call with `harness.checks.tokens.is_near_tie`. The
budget is the largest count over clips and changes whose every divergence is a near-tie; a
divergence that is not one means the change was not benign, and calibration fails rather than
widen a budget.

Bound. Each whisper-fast scenario's fast path is run (free and teacher-forced on the golden,
as the gate runs it); the gate's own measurement (`fastpath_gate.measure`) gives every
teacher-forced step's largest |logit error| against the oracle. The fast path is deterministic
on a golden key, so these numbers are its exact bound there. The run must pass the gate at
the derived budget (near-ties, rules) or nothing is written.

`--write` writes each whisper-fast scenario's calibration record (harness/goldens/calibration.py:
`goldens/<profile>/<key>/calibration/<scenario>.json`, hashed, with the origin: command, date,
machine, commit, the fast path's source hashes, the per-change figures) and sets the profile's
`budget: {"max_differing_tokens": N}` lines to the derived budget.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from harness.artifacts.files import sha256_file
from harness.checks.token_budget import token_differences
from harness.checks.tokens import is_near_tie, margin_shift
from harness.errors import HarnessError
from harness.fileio import atomic_write_bytes
from harness.goldens.calibration import CalibrationRecord, golden_identity, write_record
from harness.implementations import SPEECH
from harness.oracle.process import OracleProcess
from harness.paths import REPO_ROOT, cache_root, shown
from harness.profile import Profile
from harness.profile.load import find_profile, load_profile
from harness.provenance import device_facts

DEFAULT_VARIANTS = ("no-compile", "batch2")


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
            gap, error = margin_shift(ref_rows[r["row_offset"] + step], var_rows[v["row_offset"] + step], tr, tv)
            out.append(
                {
                    "decode_call": index,
                    "step": step,
                    "reference_token": tr,
                    "variant_token": tv,
                    "reference_gap": gap,
                    "logit_error": error,
                    "near_tie": is_near_tie(gap, error),
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
                "differing_tokens": token_differences(_transcript_tokens(ref), _transcript_tokens(var))[0],
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


def require_ffmpeg(which: Any = None) -> None:
    """The oracle's calibration transcribes through mlx-whisper's load_audio, which runs the ffmpeg
    command (`make parity` reads the WAVs in process and needs none): refuse before any work."""
    if (which or shutil.which)("ffmpeg") is None:
        raise HarnessError(
            "make calibrate needs the ffmpeg command, which is not on PATH: the oracle (mlx-whisper's "
            "load_audio) decodes every clip with it. Install it (Debian/Ubuntu: apt-get install ffmpeg; "
            "macOS: brew install ffmpeg) and run again"
        )


def run_oracle(profile: Profile, model_dir: Path, clips: list[tuple[str, str]], variants: list[str], out: Path):
    process = OracleProcess(profile.oracle)
    process.check_versions()
    job = {
        "model_dir": str(model_dir),
        "clips": [{"id": cid, "audio": str(REPO_ROOT / audio)} for cid, audio in clips],
        "options": dict(profile.defaults.options) | {"temperature": 0.0},
        "variants": variants,
    }
    with process.run("calibrate.py", job, task=f"calibration in the {profile.oracle} venv") as written:
        shutil.copytree(written, out, dirs_exist_ok=True)
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


FAST_PATH_SOURCES = ("models/whisper/fast.py", "models/whisper/fast_model.py", "models/whisper/fast_filters.py")


@dataclasses.dataclass
class FastRun:
    """One whisper-fast scenario's fast path, as the gate runs it, and what `measure` found."""

    path: Path  # where its calibration record goes
    golden: Any
    free: Any
    forced: Any
    record: CalibrationRecord  # budget still to be set

    def judged(self, budget: int) -> tuple[CalibrationRecord, Any]:
        from harness.checks.token_budget import check_token_budget

        record = dataclasses.replace(self.record, budget=budget)
        return record, check_token_budget(self.golden, self.free, self.forced, budget, record)


def fast_runs(profile: Profile, scenario_ids: list[str] | None) -> dict[str, FastRun]:
    """Every whisper-fast scenario runnable here (or those named): golden, free and
    teacher-forced fast runs, and the per-step measurement its record keeps."""
    from harness.checks.token_budget import measure
    from harness.session import ParitySession

    backend = device_facts().backend
    fast = [s for s in profile.scenarios if profile.intree_composition(s) and profile.runs_on(s, backend)]
    if scenario_ids is not None:
        unknown = sorted(set(scenario_ids) - {s.id for s in fast})
        if unknown:
            raise HarnessError(
                f"--scenarios: {unknown} are not whisper-fast scenarios of {profile.name} runnable on {backend}"
            )
        fast = [s for s in fast if s.id in scenario_ids]
    if not fast:
        raise HarnessError(f"{profile.name}: no whisper-fast scenario runnable on {backend}: nothing to calibrate")
    session = ParitySession(selected_scenarios={profile.name: {s.id for s in fast}})  # nightly ones too
    out = {}
    for scenario in fast:
        golden = session.full_golden(profile, scenario)
        free = session.intree(profile, scenario, "free")
        forced = session.intree(profile, scenario, "teacher_forced")
        store = session.store(profile.oracle_of(scenario))
        record = CalibrationRecord(
            profile=profile.name,
            scenario=scenario.id,
            device_key=store.device_key,
            golden=golden_identity(golden),
            budget=-1,
            steps=tuple(measure(golden, forced)["steps"]),
            origin={},
        )
        out[scenario.id] = FastRun(store.calibration_path(profile.name, scenario.id), golden, free, forced, record)
    return out


def write_budget(profile: Profile, budget: int) -> int:
    """Set the one-line `budget: {...}` of every whisper-fast scenario; returns how many."""
    path = Path(profile.source_file)
    text = path.read_text()
    pattern = re.compile(r"^(\s*)budget: \{.*\}\s*$", re.MULTILINE)
    line = "budget: " + json.dumps({"max_differing_tokens": budget})
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


def run(args: argparse.Namespace) -> int:
    try:
        from harness.artifacts.resolve import resolve_artifact

        profile = find_profile(args.model)
        if profile.under_test.produces != SPEECH:
            raise HarnessError(
                f"{profile.name}: calibration derives Whisper token budgets; this is {profile.under_test.name}"
            )
        wanted = set(args.clips.split(",")) if args.clips else None
        clips, seen = [], set()
        for s in profile.scenarios:
            if (wanted is None or s.id in wanted) and s.audio not in seen:
                clips.append((s.id, s.audio))
                seen.add(s.audio)
        if wanted is not None and len(clips) != len(wanted):
            raise HarnessError(f"--clips: unknown or duplicate-audio scenario ids in {sorted(wanted)}")
        require_ffmpeg()
        variants = [v for v in (args.variants or ",".join(DEFAULT_VARIANTS)).split(",") if v]
        # The fast path first (seconds): a scenario without a golden or a broken run stops here,
        # before the oracle's variants (minutes) run.
        runs = fast_runs(profile, args.scenarios.split(",") if args.scenarios else None)
        for scenario_id, run in runs.items():
            worst = max((s.max_abs_logit_error for s in run.record.steps), default=0.0)
            print(
                f"{scenario_id}: the fast path over {len(run.record.steps)} teacher-forced steps, "
                f"max |logit error| {worst:.3g}",
                flush=True,
            )
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
    command = "python -m harness calibrate " + " ".join(args.argv)
    command = command.replace(" --write", "")
    budget_origin = origin_text(summary, command, [c for c, _ in clips])
    print(f"derived budget: {summary['budget']} differing tokens per clip\norigin: {budget_origin}")
    records, failed = {}, False
    for scenario_id, run in runs.items():
        records[scenario_id], result = run.judged(summary["budget"])
        print(f"{scenario_id}: the gate at budget {summary['budget']}: {'pass' if result.passed else 'FAIL'}")
        if not result.passed:
            failed = True
            print(f"error: {scenario_id}: {result.summary}", file=sys.stderr)
    if failed:
        print("error: the fast path fails its gate at the derived budget: nothing calibrated", file=sys.stderr)
        return 1
    if args.write:
        from harness.goldens.lifecycle import harness_commit

        origin = {
            "command": command + " --write",
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
            "recorded_on": device_facts().recorded_on(),
            "harness_commit": harness_commit(),
            "fast_path_sources": {p: sha256_file(REPO_ROOT / p) for p in FAST_PATH_SOURCES},
            "budget": budget_origin,
            "bound": "each teacher-forced step's max |logit error| of the fast path against this golden, "
            "measured by harness.checks.token_budget.measure",
        }
        for scenario_id, run in runs.items():
            write_record(run.path, dataclasses.replace(records[scenario_id], origin=origin))
            print(f"wrote {shown(run.path)}")
        n = write_budget(profile, summary["budget"])
        print(f"set the budget of {n} scenario(s) in {profile.source_file}")
    return 0
