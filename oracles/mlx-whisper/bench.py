"""mlx-whisper speed probe: runs inside the oracle's own venv, never imports the harness.

Times `mlx_whisper.transcribe` (the job's options, verbose=None) on each clip the harness names.
Audio is read as mlx-whisper reads it: by the ffmpeg command, or, where there is none (the GPU
machine), the WAV's PCM in process, inside the timed call either way.

Usage: python -I bench.py --job JOB.json --out DIR [--serve]
  (job: {"model_dir", "clips", "repeats", "options"[, "profile": N]}; without --serve: DIR/result.json;
  with "profile": the stages' times, best of N, in DIR/result.json)

Without `--serve`: one warm-up transcription of the first clip, then `repeats` timed runs per clip;
one JSON object on stdout (seconds per clip and run, the text of each clip).

With `--serve` it is one side of harness.tools.bench_paired's rounds: after the model load and one
warm-up transcription of every clip it prints a `ready` line (each clip's text), then answers every
`run` line on stdin with one timed transcription of every clip (one JSON line: `seconds` per clip,
`peak_bytes`), until stdin closes.

With `--profile N` it prints where one transcription's time goes instead (one JSON line, best of N
per stage, the stages harness.tools.bench_whisper_worker --profile times in-tree): the log-Mel of
each clip (audio read included), the encoder on its first 30 s window, and one greedy decode call
on that window's features (T = 0, the options' language or English) with its decoder steps.
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
from bench_timing import best_of, emit  # noqa: E402


def profile(model_dir, clip, options, repeats):
    audio_module = importlib.import_module("mlx_whisper.audio")
    decoding = importlib.import_module("mlx_whisper.decoding")
    load_model = importlib.import_module("mlx_whisper.load_models").load_model
    dtype = mx.float16 if options.get("fp16", True) else mx.float32
    model = load_model(str(model_dir), dtype=dtype)
    n_mels = model.dims.n_mels

    def mel_of_clip():
        audio = clip if shutil.which("ffmpeg") else mx.array(common.wav_pcm(clip))
        return audio_module.log_mel_spectrogram(audio, n_mels=n_mels, padding=audio_module.N_SAMPLES)

    mel = mel_of_clip()
    window = audio_module.pad_or_trim(mel[: audio_module.N_FRAMES], audio_module.N_FRAMES, axis=-2).astype(dtype)
    window = window[None]
    features = model.encoder(window)
    mx.eval(features)
    language = options.get("language") or ("en" if model.is_multilingual else None)
    decode_options = decoding.DecodingOptions(language=language, temperature=0.0, fp16=dtype == mx.float16)
    result = decoding.decode(model, features[0], decode_options)
    return {
        "mel_s": best_of(lambda: mx.eval(mel_of_clip()), repeats),
        "encoder_s": best_of(lambda: mx.eval(model.encoder(window)), repeats),
        "decode_s": best_of(lambda: decoding.decode(model, features[0], decode_options), repeats),
        "decode_tokens": len(result.tokens),
        "decoder_steps": len(result.tokens) + 2,  # the prompt's step, one per token, the step past EOT
    }


def main():
    args = base.parser("mlx-whisper timed transcription", serve=True).parse_args()
    job, out_dir = base.read_job(args)
    model_dir = Path(job["model_dir"])
    if job.get("profile"):
        stages = {clip: profile(model_dir, clip, job["options"], job["profile"]) for clip in job["clips"]}
        (out_dir / "result.json").write_text(json.dumps({"side": "mlx-whisper", "profile": stages}))
        return
    tmod = importlib.import_module("mlx_whisper.transcribe")
    options = dict(job["options"])

    def run(clip):
        mx.synchronize()
        started = time.perf_counter()
        audio = clip if shutil.which("ffmpeg") else mx.array(common.wav_pcm(clip))  # no ffmpeg CLI: the WAV's PCM
        out = tmod.transcribe(audio, path_or_hf_repo=str(model_dir), verbose=None, **options)
        mx.synchronize()
        return time.perf_counter() - started, out["text"]

    environment = {**base.versions("mlx", "mlx-whisper"), "device": str(mx.default_device())}
    if args.serve:
        texts = {clip: run(clip)[1] for clip in job["clips"]}  # warm-up: model load, kernels, every clip once
        emit({"status": "ready", "side": "mlx-whisper", "texts": texts, **environment})
        for line in sys.stdin:
            if line.strip() != "run":
                raise SystemExit(f"bench.py --serve: expected 'run' on stdin, got {line.strip()!r}")
            mx.reset_peak_memory()
            seconds = {clip: run(clip)[0] for clip in job["clips"]}
            emit({"seconds": seconds, "peak_bytes": mx.get_peak_memory()})
        return

    run(job["clips"][0])  # warm-up: model load, compilation
    seconds, texts = {}, {}
    for clip in job["clips"]:
        timed = [run(clip) for _ in range(job["repeats"])]
        seconds[clip] = [t for t, _ in timed]
        texts[clip] = timed[0][1]
    (out_dir / "result.json").write_text(json.dumps({"seconds": seconds, "texts": texts, **environment}))


if __name__ == "__main__":
    main()
