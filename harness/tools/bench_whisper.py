"""Real-time factor of the in-tree Whisper (faithful and fast paths) vs mlx-whisper: paired, interleaved rounds.

    .venv/bin/python -m harness bench-whisper --model whisper-tiny-en [--rounds 5]
        [--paths faithful,fast,mlx-whisper] [--clips fox.wav,long.wav] [--out FILE]

RTF = transcription seconds / audio seconds (below 1 is faster than real time). Every side is a
process of its own that loads the model once and transcribes every clip once as its warm-up
(harness.tools.bench_whisper_worker for `faithful` and `fast`; oracles/mlx-whisper/bench.py
`--serve` in the oracle venv, or the interpreter `MLX_PARITY_ORACLE_PYTHON` names, for
`mlx-whisper`). Then `--rounds` paired rounds (harness.tools.bench_paired): in each round every
side transcribes every clip once, back to back, the order rotated by round, so the sides of one
round share the same minutes of a noisy host. Options: the profile's defaults (mlx-whisper's
defaults otherwise: the temperature ladder and its thresholds).

Reported per clip and side: best-of (the lowest), median, min..max and IQR of the RTF; per pair
of sides the per-round speed-up (the other side's seconds over this side's, > 1 is faster), with
the same figures; and whether every side transcribed the same text (from the warm-ups). `fast` is
the in-tree fast path (models/whisper/fast.py, fast_model.py; its warm-up compiles its encoder and decoder step).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import wave
from pathlib import Path
from typing import Any

from harness import settings
from harness.errors import UsageError
from harness.oracle.process import OracleProcess
from harness.paths import REPO_ROOT
from harness.progress import progress
from harness.tools.bench_common import loadavg, machine, machine_line, scratch_dir, write_result
from harness.tools.bench_paired import Worker, paired_rounds, spread

SIDES = ("faithful", "fast", "mlx-whisper")
ANSWER_KEYS = ("seconds", "peak_bytes")
# (numerator side, denominator side) of each per-round speed-up: denominator seconds / numerator seconds
PAIRS = (("faithful", "mlx-whisper"), ("fast", "mlx-whisper"), ("fast", "faithful"))


def clip_seconds(path: Path) -> float:
    with wave.open(str(path), "rb") as f:
        return f.getnframes() / f.getframerate()


def workers(model_dir: Path, job: Path, paths: list[str]) -> list[Worker]:
    """Every side's process, started at once (their loads and warm-ups overlap)."""
    sides = []
    for path in paths:
        if path == "mlx-whisper":
            sides.append(Worker.oracle(path, "mlx-whisper", "bench.py", job, model_dir, ANSWER_KEYS))
        else:
            cmd = [sys.executable, "-m", "harness", "bench-whisper-worker", "--model-dir", str(model_dir)]
            cmd += ["--job", str(job), "--path", path]
            sides.append(Worker(path, cmd, settings.environment(), REPO_ROOT, ANSWER_KEYS))
    return sides


def profiles(model_dir: Path, job: Path, paths: list[str], repeats: int) -> dict[str, dict[str, Any]]:
    """Every side's stage times (`--profile`), one side after the other (each its own process)."""
    from harness.tools.bench_common import run_command

    measured = {}
    for path in paths:
        if path == "mlx-whisper":
            orders = json.loads(job.read_text()) | {"model_dir": str(model_dir), "profile": repeats}
            with OracleProcess("mlx-whisper").run("bench.py", orders) as written:
                measured[path] = json.loads((written / "result.json").read_text())["profile"]
            continue
        cmd = [sys.executable, "-m", "harness", "bench-whisper-worker", "--model-dir", str(model_dir)]
        cmd += ["--job", str(job), "--path", path, "--profile", str(repeats)]
        out = run_command(cmd, env=settings.environment(), cwd=REPO_ROOT)
        measured[path] = json.loads(out.stdout.strip().splitlines()[-1])["profile"]
    return measured


def profile_table(measured: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| clip | side | mel ms | encoder ms (one window) | decode ms (one greedy call) | decoder steps | ms / step |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for side, clips in measured.items():
        for clip, p in clips.items():
            cells = [Path(clip).name, side, f"{p['mel_s'] * 1e3:.1f}", f"{p['encoder_s'] * 1e3:.1f}"]
            cells += [f"{p['decode_s'] * 1e3:.1f}", str(p["decoder_steps"])]
            cells.append(f"{p['decode_s'] * 1e3 / p['decoder_steps']:.3f}")
            lines.append("| " + " | ".join(cells) + " |")
    for side, clips in measured.items():
        for clip, p in clips.items():
            if "fast_step" in p:
                s = p["fast_step"]
                lines.append("")
                lines.append(
                    f"{side} compiled step alone ({Path(clip).name}): {s['host_ms']:.3f} ms host to build and queue, "
                    f"{s['pipelined_ms']:.3f} ms per step pipelined, {s['synced_ms']:.3f} ms read after each step"
                )
    return "\n".join(lines)


def summarize(
    clips: list[str], audio: dict[str, float], ready: dict[str, dict[str, Any]], runs: dict[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Per clip: RTF figures per side, per-round speed-ups per pair, same text or not."""
    rows = []
    for clip in clips:
        row: dict[str, Any] = {"clip": Path(clip).name, "audio_s": audio[clip], "rtf": {}, "speedup": {}}
        seconds = {side: [r["seconds"][clip] for r in side_runs] for side, side_runs in runs.items()}
        for side, values in seconds.items():
            row["rtf"][side] = spread([s / audio[clip] for s in values], lower_is_better=True)
        for fast, slow in PAIRS:
            if fast in seconds and slow in seconds:
                ratios = [b / a for a, b in zip(seconds[fast], seconds[slow], strict=True)]
                row["speedup"][f"{fast}/{slow}"] = spread(ratios)
        row["texts"] = {side: r["texts"][clip] for side, r in ready.items()}
        row["same_text"] = len(set(row["texts"].values())) == 1
        row["work"] = {side: r["work"][clip] for side, r in ready.items() if "work" in r}
        if "faithful" in ready and "fast" in ready:
            row["fast_same_tokens_as_faithful"] = (
                ready["fast"]["tokens_sha256"][clip] == ready["faithful"]["tokens_sha256"][clip]
            )
        rows.append(row)
    return rows


def table(result: dict[str, Any]) -> str:
    sides = result["paths"]

    def cell(s: dict[str, Any], unit: str = "") -> str:
        return f"{s['best']:.3f}{unit} / {s['median']:.3f}{unit} ({s['min']:.3f}..{s['max']:.3f})"

    lines = [
        f"{result['model']}: {result['rounds']} paired rounds (every side transcribes every clip once per round, "
        f"each side its own process, order rotated by round); options {json.dumps(result['options'])}",
        "",
        "| clip | audio s | " + " | ".join(f"{s} RTF: best / median (min..max)" for s in sides) + " | same text |",
        "|---|---:|" + "---:|" * len(sides) + "---|",
    ]
    for row in result["rows"]:
        cells = [row["clip"], f"{row['audio_s']:.2f}", *(cell(row["rtf"][s]) for s in sides), str(row["same_text"])]
        lines.append("| " + " | ".join(cells) + " |")
    for row in result["rows"]:
        for side, work in row["work"].items():
            lines.append(
                f"  {row['clip']} {side}: {work['decode_calls']} decode calls, {work['decoder_steps']} decoder steps"
            )
    pairs = [p for p in (f"{a}/{b}" for a, b in PAIRS) if any(p in r["speedup"] for r in result["rows"])]
    if pairs:
        lines += ["", "| per-round speed-up (x): best / median (min..max) | " + " | ".join(pairs) + " |"]
        lines.append("|---|" + "---:|" * len(pairs))
        for row in result["rows"]:
            lines.append("| " + row["clip"] + " | " + " | ".join(cell(row["speedup"][p], "x") for p in pairs) + " |")
    lines += ["", machine_line(result["machine"])]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = sorted(set(paths) - set(SIDES))
    if unknown or not paths or len(set(paths)) != len(paths):
        raise UsageError(f"--paths: got {paths}; expected distinct names among {', '.join(SIDES)}")
    if args.rounds < 1:
        raise UsageError(f"--rounds: need at least 1, got {args.rounds}")

    from harness.provenance import device_facts
    from harness.session import ParitySession

    session = ParitySession()
    profile = session.profile(args.model)
    model_dir = session.artifact(profile).model_dir
    clips = sorted({str(REPO_ROOT / s.audio) for s in profile.active_scenarios(device_facts().backend) if s.audio})
    if args.clips:
        wanted = [c.strip() for c in args.clips.split(",") if c.strip()]
        missing = [w for w in wanted if w not in {Path(c).name for c in clips}]
        if missing:
            raise UsageError(f"--clips: {missing} not among the profile's clips {[Path(c).name for c in clips]}")
        clips = [c for c in clips if Path(c).name in wanted]
    if not clips:
        raise UsageError(f"profile {profile.name} has no audio clips on this backend")
    options = dict(profile.defaults.options)
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="bench-whisper-", dir=scratch_dir()) as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"clips": clips, "repeats": 1, "options": options}))
        if args.profile:
            with progress.task(f"bench_whisper: stage times of {', '.join(paths)}, best of {args.profile}"):
                measured = profiles(model_dir, job, paths, args.profile)
            result = {"model": profile.name, "options": options, "profile": measured, "machine": machine(load_before)}
            print(profile_table(measured) + "\n\n" + machine_line(result["machine"]))
            write_result(result, f"whisper-profile-{profile.name}", args.out)
            return 0
        sides = workers(model_dir, job, paths)
        try:
            with progress.task(f"bench_whisper: load and warm up {', '.join(paths)}"):
                ready = {w.name: w.wait_ready() for w in sides}
            with progress.task(f"bench_whisper: {args.rounds} paired rounds over {len(clips)} clip(s)"):
                runs = paired_rounds(sides, args.rounds)
        finally:
            for w in sides:
                w.close()
    audio = {clip: clip_seconds(Path(clip)) for clip in clips}
    result: dict[str, Any] = {
        "model": profile.name,
        "rounds": args.rounds,
        "options": options,
        "paths": paths,
        "order": "round r starts with side r mod n of " + ", ".join(paths),
        "rows": summarize(clips, audio, ready, runs),
        "peak_memory_gb": {side: max(r["peak_bytes"] for r in rs) / 1e9 for side, rs in runs.items()},
        "warmup_s": {side: r.get("warmup_s") for side, r in ready.items()},
        "machine": machine(load_before),
    }
    if "mlx-whisper" in ready:
        result["oracle"] = {k: ready["mlx-whisper"].get(k) for k in ("mlx", "mlx-whisper", "device")}
    print(table(result))
    write_result(result, f"whisper-{profile.name}", args.out)
    return 0
