"""Real-time factor of the in-tree Whisper vs mlx-whisper on the same clips, same run.

    .venv/bin/python -m harness.bench_whisper --model whisper-tiny-en [--repeats 3]

RTF = transcription seconds / audio seconds (below 1 is faster than real time). Both sides
transcribe the profile's clips with the profile's default options (greedy ladder as
mlx-whisper's defaults otherwise), each in its own process with one warm-up transcription;
the median of `repeats` runs per clip is reported. In-tree runs the plain transcribe (no
recording of logits), mlx-whisper runs in its oracle venv (oracles/mlx-whisper/bench.py).
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

from harness.paths import REPO_ROOT, cache_root, oracles_dir, reports_dir
from harness.provenance import device_facts


def clip_seconds(path: Path) -> float:
    with wave.open(str(path), "rb") as f:
        return f.getnframes() / f.getframerate()


def intree_seconds(model_dir: Path, clips: list[str], options: dict[str, Any], repeats: int) -> dict[str, Any]:
    import mlx.core as mx

    from models.whisper.load import load_model
    from models.whisper.tokenizer import load_encoding
    from models.whisper.transcribe import transcribe

    fp16 = bool(options.get("fp16", False))
    model = load_model(model_dir, dtype=mx.float16 if fp16 else mx.float32)
    encoding = load_encoding(model_dir, model.num_languages, model.dims.n_vocab)

    def run(clip: str) -> tuple[float, str]:
        started = time.perf_counter()
        out = transcribe(model, clip, encoding, verbose=None, **options)
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

    from harness.venvs import ensure_oracle_env

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
    parser = argparse.ArgumentParser(prog="python -m harness.bench_whisper", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="whisper-tiny-en")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)

    from harness.session import ParitySession

    session = ParitySession()
    profile = session.profile(args.model)
    model_dir = session.artifact(profile).model_dir
    clips = sorted({str(REPO_ROOT / s.audio) for s in profile.active_scenarios(device_facts().backend) if s.audio})
    options = dict(profile.defaults.options)
    intree = intree_seconds(model_dir, clips, options, args.repeats)
    oracle = oracle_seconds(model_dir, clips, options, args.repeats)
    rows = []
    for clip in clips:
        audio = clip_seconds(Path(clip))
        a, b = statistics.median(intree["seconds"][clip]), statistics.median(oracle["seconds"][clip])
        rows.append(
            {
                "clip": Path(clip).name,
                "audio_s": audio,
                "intree_s": a,
                "mlx_whisper_s": b,
                "intree_rtf": a / audio,
                "mlx_whisper_rtf": b / audio,
                "same_text": intree["texts"][clip] == oracle["texts"][clip],
            }
        )
    result = {
        "model": profile.name,
        "repeats": args.repeats,
        "options": options,
        "rows": rows,
        "device": device_facts().as_dict(),
        "oracle": {k: oracle[k] for k in ("mlx", "mlx-whisper", "device")},
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    lines = [
        "| clip | audio s | in-tree s | mlx-whisper s | in-tree RTF | mlx-whisper RTF | same text |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['clip']} | {r['audio_s']:.2f} | {r['intree_s']:.2f} | {r['mlx_whisper_s']:.2f} | "
            f"{r['intree_rtf']:.3f} | {r['mlx_whisper_rtf']:.3f} | {r['same_text']} |"
        )
    print("\n".join(lines))
    out = args.out or reports_dir() / f"bench-{profile.name}-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"bench: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
