"""mlx-whisper speed probe: runs inside the oracle's own venv, never imports the harness.

Times `mlx_whisper.transcribe` (fp16 per the job, verbose=None) on each clip the harness names:
one warm-up transcription of the first clip, then `repeats` timed runs per clip. Prints one JSON
object on stdout: seconds per clip and run, and the text (to check both sides transcribed alike).

Usage: python -I bench.py --model-dir DIR --job job.json   (job: {"clips": [...], "repeats", "options"})
"""

import importlib
import json
import shutil
import sys
import time
from pathlib import Path

import mlx.core as mx

# oracles/common, by path: the oracle venv does not have this repository on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import oracle_base as base  # noqa: E402
import whisper_run as common  # noqa: E402


def main():
    args = base.path_parser("--model-dir", "--job").parse_args()
    job = json.loads(args.job.read_text())
    tmod = importlib.import_module("mlx_whisper.transcribe")
    options = dict(job["options"])

    def run(clip):
        started = time.perf_counter()
        audio = clip if shutil.which("ffmpeg") else mx.array(common.wav_pcm(clip))  # no ffmpeg CLI: the WAV's PCM
        out = tmod.transcribe(audio, path_or_hf_repo=str(args.model_dir), verbose=None, **options)
        mx.synchronize()
        return time.perf_counter() - started, out["text"]

    run(job["clips"][0])  # warm-up: model load, compilation
    seconds, texts = {}, {}
    for clip in job["clips"]:
        timed = [run(clip) for _ in range(job["repeats"])]
        seconds[clip] = [t for t, _ in timed]
        texts[clip] = timed[0][1]
    print(
        json.dumps(
            {
                "seconds": seconds,
                "texts": texts,
                **base.versions("mlx", "mlx-whisper"),
                "device": str(mx.default_device()),
            }
        )
    )


if __name__ == "__main__":
    main()
