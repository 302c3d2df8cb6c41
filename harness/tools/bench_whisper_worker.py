"""One in-tree side of `bench-whisper` in a process of its own (harness.tools.bench_paired's protocol).

    python -m harness bench-whisper-worker --model-dir DIR --job job.json --path faithful|fast [--profile N]

Loads the model once (models.whisper.load, in the dtype the options ask for), transcribes every
clip of the job once as the warm-up (the fast path compiles its encoder and decoder step there,
as a server would once), prints a `ready` line with each clip's text, the sha256 of its segments'
tokens and its decode calls and decoder steps, then answers every `run` line on stdin with one
timed transcription of every clip: `{"seconds": {clip: s}, "peak_bytes": n}`. Timing as
oracles/mlx-whisper/bench.py times mlx-whisper: from the audio path to the result, device work
included (`mx.synchronize` before and after). The fast path forgets its last window's audio
features before each transcription, so every timed run encodes its windows itself.

`--profile N` prints where one transcription's time goes instead (one JSON line, best of N per
stage, the same stages as oracles/mlx-whisper/bench.py --profile): the log-Mel of each clip, the
encoder on its first 30 s window, and one greedy decode call on that window's features (T = 0,
the options' language or English, mlx-whisper's default sample_len) with its decoder steps.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from harness.oracle.sources import load_common

PATHS = ("faithful", "fast")


def bench_timing() -> Any:
    """oracles/common/bench_timing.py (emit, best_of): the mlx-whisper side's, loaded when first used."""
    return load_common("bench_timing")


class InTree:
    """One in-tree path over a model loaded once: `transcribe(clip)`, and its stages for `profile`."""

    def __init__(self, model_dir: Path, options: dict[str, Any], path: str):
        import mlx.core as mx

        from models.whisper.load import load_model
        from models.whisper.tokenizer import load_encoding

        if path not in PATHS:
            raise SystemExit(f"bench_whisper_worker: --path: expected one of {PATHS}, got {path!r}")
        self.path, self.options = path, options
        self.dtype = mx.float16 if options.get("fp16", True) else mx.float32
        self.model: Any = load_model(model_dir, dtype=self.dtype)
        self.encoding = load_encoding(model_dir, self.model.num_languages, self.model.dims.n_vocab)
        self.extra: dict[str, Any] = {}
        if path == "fast":
            from models.whisper.fast import fast_decode
            from models.whisper.fast_model import as_fast

            self.model = as_fast(self.model)
            self.extra = {"decode_fn": fast_decode}

    def transcribe(self, clip: str, observer: Any = None) -> tuple[float, dict[str, Any]]:
        import mlx.core as mx

        from models.whisper.transcribe import transcribe

        if self.path == "fast":
            self.model._features_memo = None  # each timed transcription encodes its windows itself
        mx.synchronize()
        started = time.perf_counter()
        out = transcribe(self.model, clip, self.encoding, verbose=None, observer=observer, **self.options, **self.extra)
        mx.synchronize()
        return time.perf_counter() - started, out

    def profile(self, clip: str, repeats: int) -> dict[str, Any]:
        import mlx.core as mx

        from models.whisper.audio import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim
        from models.whisper.decoding import decode
        from models.whisper.decoding_types import DecodingOptions

        model, n_mels = self.model, self.model.dims.n_mels
        mel = log_mel_spectrogram(clip, n_mels=n_mels, padding=N_SAMPLES)
        window = pad_or_trim(mel[:N_FRAMES], N_FRAMES, axis=-2).astype(self.dtype)[None]
        mx.eval(window)

        def encode(window: Any) -> Any:
            if self.path == "fast":
                model._features_memo = None  # the fast encoder would hand back the last window's features
            return model.embed_audio(window)

        features = encode(window)
        mx.eval(features)
        language = self.options.get("language") or ("en" if model.is_multilingual else None)
        options = DecodingOptions(language=language, temperature=0.0, fp16=self.dtype == mx.float16)
        if self.path == "fast":
            from models.whisper.fast import fast_decode

            def decode_call() -> Any:
                return fast_decode(model, features[0], self.encoding, options)
        else:

            def decode_call() -> Any:
                return decode(model, features[0], self.encoding, options)

        result = decode_call()
        stages = {
            "mel_s": bench_timing().best_of(
                lambda: mx.eval(log_mel_spectrogram(clip, n_mels=n_mels, padding=N_SAMPLES)), repeats
            ),
            "encoder_s": bench_timing().best_of(lambda: mx.eval(encode(window)), repeats),
            "decode_s": bench_timing().best_of(decode_call, repeats),
            "decode_tokens": len(result.tokens),
            "decoder_steps": len(result.tokens) + 2,  # the prompt's step, one per token, the step past EOT
        }
        if self.path == "fast":
            stages["fast_step"] = fast_step_timing(model, features, self.encoding, options)
        return stages


def fast_step_timing(fast: Any, features: Any, encoding: Any, options: Any, steps: int = 64) -> dict[str, float]:
    """Is the fast path's decoder step bound by the host or by the device? Its compiled step,
    called `steps` times at one position (a timing, not a decode): `host_ms`, the time to build
    and queue one step; `pipelined_ms`, per step when each is queued before the previous one's
    result is read (as the decode loop runs: about the larger of host and device time);
    `synced_ms`, per step when each result is read before the next is built (host + device)."""
    import mlx.core as mx

    from models.whisper.fast import _FastTask
    from models.whisper.fast_filters import FilterState

    task = _FastTask(fast, options, encoding, None, None)
    step = fast.step(task.filters, False, task.eot)
    cross = fast.cross_kv(features)
    prompt = mx.array([task.task.initial_tokens], mx.int32)
    _raw, _sot, self_kv = fast.prefill(prompt, cross, task.task.sot_index)
    state, sums, no_force = FilterState.initial(1), mx.zeros((1,), mx.float32), mx.zeros((1,), mx.int32)
    token, offset = prompt[:, -1], mx.array(prompt.shape[1], mx.int32)
    mx.eval(self_kv, cross, token, offset)

    def run(sync_each: bool) -> tuple[float, float]:
        host = 0.0
        previous = None
        mx.synchronize()
        started = time.perf_counter()
        for _ in range(steps):
            queued = time.perf_counter()
            out = step(token, offset, self_kv, cross, state, sums, no_force)
            mx.async_eval(out[2], out[3], out[4], out[1])
            host += time.perf_counter() - queued
            if sync_each:
                out[3].item()
            elif previous is not None:
                previous.item()
            previous = out[3]
        mx.synchronize()
        return (time.perf_counter() - started) / steps, host / steps

    run(False)  # the trace and its kernels
    pipelined, host = run(False)
    synced, _ = run(True)
    return {"host_ms": host * 1e3, "pipelined_ms": pipelined * 1e3, "synced_ms": synced * 1e3}


def step_counter() -> Any:
    """A transcription observer that counts decode calls and decoder steps (it reads no array)."""
    from models.whisper.hooks import TranscribeObserver

    class StepCounter(TranscribeObserver):
        def __init__(self) -> None:
            self.calls = self.steps = 0

        def on_decode_begin(self, initial_tokens: tuple[int, ...], n_batch: int, temperature: float) -> None:
            self.calls += 1

        def on_step(self, logits: Any, tokens: Any, kept: bool) -> None:
            self.steps += 1  # the step computed past the end included: it costs as much

    return StepCounter()


def tokens_digest(result: dict[str, Any]) -> str:
    tokens = [t for segment in result["segments"] for t in segment["tokens"]]
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()


def serve(side: InTree, clips: list[str]) -> None:
    """The paired-rounds protocol: a ready line after the warm-up, then one timed run per `run` line."""
    import mlx.core as mx

    started = time.perf_counter()
    warm, counts = {}, {}
    for clip in clips:
        counter = step_counter()
        warm[clip] = side.transcribe(clip, counter)[1]
        counts[clip] = {"decode_calls": counter.calls, "decoder_steps": counter.steps}
    bench_timing().emit(
        {
            "status": "ready",
            "side": side.path,
            "warmup_s": time.perf_counter() - started,
            "texts": {clip: out["text"] for clip, out in warm.items()},
            "tokens_sha256": {clip: tokens_digest(out) for clip, out in warm.items()},
            "work": counts,
            "device": str(mx.default_device()),
        }
    )
    for line in sys.stdin:
        if line.strip() != "run":
            raise SystemExit(f"bench_whisper_worker: expected 'run' on stdin, got {line.strip()!r}")
        mx.reset_peak_memory()
        seconds = {clip: side.transcribe(clip)[0] for clip in clips}
        bench_timing().emit({"seconds": seconds, "peak_bytes": mx.get_peak_memory()})


def run(args: argparse.Namespace) -> int:
    job = json.loads(args.job.read_text())
    side = InTree(args.model_dir, dict(job["options"]), args.path)
    if args.profile:
        bench_timing().emit(
            {"side": args.path, "profile": {clip: side.profile(clip, args.profile) for clip in job["clips"]}}
        )
        return 0
    serve(side, job["clips"])
    return 0
