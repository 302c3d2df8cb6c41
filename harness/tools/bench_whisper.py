"""Real-time factor of the in-tree Whisper (faithful and fast paths) vs mlx-whisper, same clips, same run.

    .venv/bin/python -m harness bench-whisper --model whisper-tiny-en [--repeats 3]
        [--paths faithful,fast,mlx-whisper] [--clips fox.wav,long.wav]

RTF = transcription seconds / audio seconds (below 1 is faster than real time). Both sides
transcribe the profile's clips with the profile's default options (greedy ladder as
mlx-whisper's defaults otherwise), each in its own process with one warm-up transcription;
the median of `repeats` runs per clip is reported. In-tree runs the plain transcribe (no
recording of logits), mlx-whisper runs in its oracle venv (oracles/mlx-whisper/bench.py).
`fast` is the in-tree fast path (models/whisper/fast.py: transcribe with `fast_decode` on a
FastWhisper, built once from the same loaded model); its warm-up compiles its decoder step.
The speed-up column is faithful seconds over fast seconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

from harness.paths import REPO_ROOT, cache_root, oracles_dir
from harness.provenance import device_facts
from harness.tools.bench_common import (
    write_result,
)


def clip_seconds(path: Path) -> float:
    with wave.open(str(path), "rb") as f:
        return f.getnframes() / f.getframerate()


def intree_seconds(
    model_dir: Path, clips: list[str], options: dict[str, Any], repeats: int, path: str = "faithful"
) -> dict[str, Any]:
    import mlx.core as mx

    from models.whisper.load import load_model
    from models.whisper.tokenizer import load_encoding
    from models.whisper.transcribe import transcribe

    fp16 = bool(options.get("fp16", False))
    model = load_model(model_dir, dtype=mx.float16 if fp16 else mx.float32)
    encoding = load_encoding(model_dir, model.num_languages, model.dims.n_vocab)
    extra: dict[str, Any] = {}
    if path == "fast":
        from models.whisper.fast import as_fast, fast_decode

        model = as_fast(model)
        extra = {"decode_fn": fast_decode}
    elif path != "faithful":
        raise SystemExit(f"unknown in-tree path {path!r}: expected faithful or fast")

    def run(clip: str) -> tuple[float, str]:
        if path == "fast":
            model._features_memo = None  # each timed transcription encodes its windows itself
        started = time.perf_counter()
        out = transcribe(model, clip, encoding, verbose=None, **options, **extra)
        mx.synchronize()
        return time.perf_counter() - started, out["text"]

    run(clips[0])  # warm-up
    seconds, texts = {}, {}
    for clip in clips:
        timed = [run(clip) for _ in range(repeats)]
        seconds[clip] = [t for t, _ in timed]
        texts[clip] = timed[0][1]
    return {"seconds": seconds, "texts": texts}


def oracle_seconds(model_dir: Path, clips: list[str], options: dict[str, Any], repeats: int) -> dict[str, Any]:
    import subprocess

    from harness.runners.venvs import ensure_oracle_env

    env = ensure_oracle_env("mlx-whisper")
    (cache_root() / "tmp").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-whisper-", dir=cache_root() / "tmp") as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"clips": clips, "repeats": repeats, "options": options}))
        cmd, child_env = env.command(
            str(oracles_dir() / "mlx-whisper" / "bench.py"), "--model-dir", str(model_dir), "--job", str(job)
        )
        out = subprocess.run(cmd, capture_output=True, text=True, env=child_env | {"HF_HUB_OFFLINE": "1"}, check=False)
    if out.returncode != 0:
        raise SystemExit(f"mlx-whisper bench failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness bench-whisper", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="whisper-tiny-en")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--paths",
        default="faithful,mlx-whisper",
        help="comma-separated: faithful, fast, mlx-whisper (default %(default)s)",
    )
    parser.add_argument("--clips", help="comma-separated clip file names (default: every clip of the profile)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = sorted(set(paths) - {"faithful", "fast", "mlx-whisper"})
    if unknown or not paths:
        raise SystemExit(f"--paths: unknown {unknown}; expected a subset of faithful, fast, mlx-whisper")

    from harness.session import ParitySession

    session = ParitySession()
    profile = session.profile(args.model)
    model_dir = session.artifact(profile).model_dir
    clips = sorted({str(REPO_ROOT / s.audio) for s in profile.active_scenarios(device_facts().backend) if s.audio})
    if args.clips:
        wanted = [c.strip() for c in args.clips.split(",") if c.strip()]
        missing = [w for w in wanted if w not in {Path(c).name for c in clips}]
        if missing:
            raise SystemExit(f"--clips: {missing} not among the profile's clips {[Path(c).name for c in clips]}")
        clips = [c for c in clips if Path(c).name in wanted]
    options = dict(profile.defaults.options)
    measured: dict[str, dict[str, Any]] = {}
    for path in paths:
        if path == "mlx-whisper":
            measured[path] = oracle_seconds(model_dir, clips, options, args.repeats)
        else:
            measured[path] = intree_seconds(model_dir, clips, options, args.repeats, path)
    rows = []
    for clip in clips:
        audio = clip_seconds(Path(clip))
        row: dict[str, Any] = {"clip": Path(clip).name, "audio_s": audio}
        for path in paths:
            seconds = statistics.median(measured[path]["seconds"][clip])
            row[f"{path}_s"] = seconds
            row[f"{path}_rtf"] = seconds / audio
            row[f"{path}_text"] = measured[path]["texts"][clip]
        if "faithful" in paths and "fast" in paths:
            row["speedup_fast_over_faithful"] = row["faithful_s"] / row["fast_s"]
        texts = {row[f"{p}_text"] for p in paths}
        row["same_text"] = len(texts) == 1
        rows.append(row)
    result = {
        "model": profile.name,
        "repeats": args.repeats,
        "options": options,
        "paths": paths,
        "rows": rows,
        "device": device_facts().as_dict(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    if "mlx-whisper" in measured:
        result["oracle"] = {k: measured["mlx-whisper"][k] for k in ("mlx", "mlx-whisper", "device")}
    header = ["clip", "audio s", *[f"{p} s" for p in paths], *[f"{p} RTF" for p in paths]]
    speedup = "faithful" in paths and "fast" in paths
    if speedup:
        header.append("fast speed-up")
    header.append("same text")
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 2) + "---|"]
    for r in rows:
        cells = [r["clip"], f"{r['audio_s']:.2f}"]
        cells += [f"{r[f'{p}_s']:.2f}" for p in paths] + [f"{r[f'{p}_rtf']:.3f}" for p in paths]
        if speedup:
            cells.append(f"{r['speedup_fast_over_faithful']:.2f}x")
        cells.append(str(r["same_text"]))
        lines.append("| " + " | ".join(cells) + " |")
    print("\n".join(lines))
    write_result(result, profile.name, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
