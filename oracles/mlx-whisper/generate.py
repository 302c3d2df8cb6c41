"""mlx-whisper oracle generator: runs inside the oracle's own venv, never imports the harness.

Reads a scenario spec (JSON), runs `mlx_whisper.transcribe` on each scenario's WAV file exactly
as a user would (the package's own loader, seek loop, temperature fallback and decoding), and
records what the in-tree port must reproduce. Nothing in the installed package is edited: the
captures wrap a few of its functions at run time, and put the originals back afterwards.

Per scenario it writes
  <id>.mel.npy      the whole clip's log-mel spectrogram as transcribe computes it
                    (frames incl. the 30 s of zero padding, n_mels) f32
  <id>.encoder.npy  the encoder output of every decode call (n_calls, n_audio_ctx, n_audio_state)
  <id>.logits.npy   every decoder step's logits before the logit filters, (rows, n_vocab) f32:
                    decode calls in order, within a call step-major, then batch member
and in result.json `scenarios[id]`: the token chosen after each logits row, one entry per
decode call (each window and each temperature attempt: where its rows start, its steps, batch,
initial tokens, per-member tokens, scores and the fallback decision), and the transcript.

mlx-whisper's decode loop computes one step ahead of what it has checked (it starts step i+1
before it reads whether step i completed the batch); the logits of that discarded look-ahead
step are not part of the output, and each decode call says whether it had one.

Usage: python -I generate.py --spec spec.json --out DIR

The spec check (`validate_spec`) uses the standard library only, so it can be imported and
tested without the oracle venv; mlx and mlx_whisper are imported inside the functions that run.
What both whisper generators share is in oracles/common (whisper_spec.py, whisper_run.py,
oracle_base.py), loaded by file path.
"""

from __future__ import annotations

import functools
import importlib
import json
import shutil
import sys
from pathlib import Path

# oracles/common, by path: the oracle venv does not have this repository on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import oracle_base as base  # noqa: E402
import whisper_run as common  # noqa: E402
import whisper_spec as spec_check  # noqa: E402

SpecError = spec_check.SpecError

# Keyword arguments of mlx_whisper.transcribe (0.4.3) a scenario may set, besides the
# DecodingOptions fields it passes on (whisper_spec.DECODING_OPTIONS).
TRANSCRIBE_OPTIONS = spec_check.TRANSCRIBE_OPTIONS
# Set by the generator itself: the model directory, and no printing.
RESERVED_OPTIONS = frozenset({"path_or_hf_repo", "verbose", "audio", "prompt"})
RULES = spec_check.Rules(
    "mlx_whisper.transcribe",
    TRANSCRIBE_OPTIONS,
    RESERVED_OPTIONS,
    spec_check.BOOL_OPTIONS,
    ("weights.safetensors", "weights.npz"),
)


class CaptureError(RuntimeError):
    """What the wrappers recorded does not add up: the oracle's output would be incomplete."""


def validate_spec(spec) -> None:
    """Raise SpecError naming every problem of the spec, before anything is loaded or run."""
    RULES.validate(spec)


# ---------------------------------------------------------------- capture


class Capture(common.CaptureState):
    """What one transcription computed, recorded by wrappers around mlx-whisper's functions."""

    def install(self):
        import mlx_whisper  # noqa: F401  (registers the submodules)

        audio = importlib.import_module("mlx_whisper.audio")
        decoding = importlib.import_module("mlx_whisper.decoding")
        tmod = importlib.import_module("mlx_whisper.transcribe")
        transcribe_code = tmod.transcribe.__code__
        cap = self
        orig_mel, orig_load = tmod.log_mel_spectrogram, audio.load_audio
        orig_run, orig_features = decoding.DecodingTask.run, decoding.DecodingTask._get_audio_features
        orig_loop, orig_logits = decoding.DecodingTask._main_loop, decoding.Inference.logits
        orig_update = decoding.GreedyDecoder.update

        def log_mel_spectrogram(*args, **kwargs):
            out = orig_mel(*args, **kwargs)
            cap.mel.append(out)
            return out

        def load_audio(*args, **kwargs):
            if shutil.which("ffmpeg") is None:
                # A machine without the ffmpeg CLI (the lent GPU machine has no package index):
                # the WAV's 16-bit PCM / 32768, which is what ffmpeg gives for these clips
                # (checked on every CPU golden: audio.decoded_equals_wav_pcm). Recorded in the
                # environment block, so such goldens say how their audio was read.
                import mlx.core as mx

                out = mx.array(common.wav_pcm(args[0]))
            else:
                out = orig_load(*args, **kwargs)
            cap.waveforms.append(out)
            return out

        def run(task, mel):
            call = {
                "window": common.seek_window(transcribe_code),
                "temperature": task.options.temperature,
                "initial_tokens": list(task.initial_tokens),
                "sample_begin": task.sample_begin,
                "eot": task.tokenizer.eot,
                "rows": [],
                "chosen": [],
                "features": [],
                "loop_tokens": [],
            }
            cap.calls.append(call)
            cap.current = call
            try:
                call["results"] = orig_run(task, mel)
            finally:
                cap.current = None
            return call["results"]

        def get_audio_features(task, mel):
            out = orig_features(task, mel)
            if cap.current is not None:
                cap.current["features"].append(out)
            return out

        def main_loop(task, audio_features, tokens):
            out = orig_loop(task, audio_features, tokens)
            if cap.current is not None:
                cap.current["loop_tokens"].append(out[0])
            return out

        def logits(inference, tokens, audio_features):
            out = orig_logits(inference, tokens, audio_features)
            if cap.current is None:
                cap.stray_logits += 1
            else:
                # Lazy: evaluated after the decode call, so the capture never changes its schedule.
                cap.current["rows"].append(out[:, -1, :])
            return out

        def update(decoder, tokens, logits, sum_logprobs):
            out = orig_update(decoder, tokens, logits, sum_logprobs)
            if cap.current is not None:
                cap.current["chosen"].append(out[0][:, -1])
            return out

        return common.patched(
            [
                (tmod, "log_mel_spectrogram", log_mel_spectrogram),
                (audio, "load_audio", load_audio),
                (decoding.DecodingTask, "run", run),
                (decoding.DecodingTask, "_get_audio_features", get_audio_features),
                (decoding.DecodingTask, "_main_loop", main_loop),
                (decoding.Inference, "logits", logits),
                (decoding.GreedyDecoder, "update", update),
            ]
        )


def _fallback(result, thresholds):
    """transcribe's decode_with_fallback decision for one attempt: (needs_fallback, reasons)."""
    reasons = []
    if thresholds["compression_ratio_threshold"] is not None:
        if result.compression_ratio > thresholds["compression_ratio_threshold"]:
            reasons.append("compression_ratio")  # too repetitive
    if thresholds["logprob_threshold"] is not None:
        if result.avg_logprob < thresholds["logprob_threshold"]:
            reasons.append("avg_logprob")  # too improbable
    needs = bool(reasons)
    if thresholds["no_speech_threshold"] is not None and result.no_speech_prob > thresholds["no_speech_threshold"]:
        needs = False  # taken for silence: no retry
        if reasons:
            reasons.append("overridden_by_no_speech")
    return needs, reasons


def run_scenario(model_dir: str, model, scenario: dict):
    """One transcription with captures. Returns (meta, arrays by name) ready to write."""
    import mlx.core as mx
    import numpy as np

    tmod = importlib.import_module("mlx_whisper.transcribe")
    options = dict(scenario.get("options", {}))
    options.setdefault("fp16", False)  # fp32 on the CPU backend; the weights are fp32
    dims = model.dims
    capture = Capture()
    # mlx-whisper's sampler is an @mx.compile'd function: the random key it draws while being
    # traced becomes a constant of that trace, reused by every later call with the same shapes.
    # A fresh compiled function per scenario gives each transcription what it gets in a fresh
    # process (and makes goldens independent of scenario order); the in-tree side does the same.
    decoding = importlib.import_module("mlx_whisper.decoding")
    decoding.categorical = mx.compile(lambda logits, temp: mx.random.categorical(logits / temp))
    mx.random.seed(scenario["seed"])
    with capture.install():
        transcript = tmod.transcribe(scenario["audio"], path_or_hf_repo=model_dir, verbose=None, **options)

    if len(capture.mel) != 1:
        raise CaptureError(f"expected one log_mel_spectrogram call, saw {len(capture.mel)}")
    if capture.stray_logits:
        raise CaptureError(f"{capture.stray_logits} Inference.logits calls outside a decode call")
    mel = np.array(capture.mel[0].astype(mx.float32))

    thresholds, ladder = common.transcribe_defaults(tmod.transcribe, options)
    decode_calls, rows, tokens, encoder = [], [], [], []
    for index, call in enumerate(capture.calls):
        if len(call["features"]) != 1 or len(call["loop_tokens"]) != 1:
            raise CaptureError(
                f"decode call {index}: expected one encoder pass and one main loop, "
                f"saw {len(call['features'])} and {len(call['loop_tokens'])}"
            )
        (result,) = call["results"]  # transcribe decodes one window at a time
        loop_tokens = np.array(call["loop_tokens"][0])  # (batch, sample_begin + n_steps) before finalize
        batch, begin = loop_tokens.shape[0], call["sample_begin"]
        n_steps = loop_tokens.shape[1] - begin
        steps_computed = len(call["rows"])
        # The loop runs one step ahead: when it stops on a completed batch, the last step is unused.
        lookahead = steps_computed - n_steps
        if lookahead not in (0, 1) or len(call["chosen"]) != steps_computed:
            raise CaptureError(
                f"decode call {index}: {steps_computed} logits calls and {len(call['chosen'])} token "
                f"updates for {n_steps} kept steps"
            )
        step_logits = [np.array(r.astype(mx.float32)) for r in call["rows"][:n_steps]]
        chosen = np.array(mx.stack(call["chosen"][:n_steps], axis=0)) if n_steps else np.zeros((0, batch), int)
        if chosen.shape != (n_steps, batch) or not np.array_equal(chosen.T, loop_tokens[:, begin:]):
            raise CaptureError(f"decode call {index}: the tokens the decoder chose differ from the loop's tokens")
        if any(s.shape != (batch, dims.n_vocab) for s in step_logits):
            raise CaptureError(f"decode call {index}: a logits row is not ({batch}, {dims.n_vocab})")
        features = call["features"][0]
        if features.shape != (1, dims.n_audio_ctx, dims.n_audio_state):
            raise CaptureError(f"decode call {index}: encoder output has shape {features.shape}")

        # Per member, the sampled tokens (cut at the first EOT, as the task cuts them).
        members = [[int(t) for t in row[begin:]] for row in loop_tokens]
        decode_calls.append(
            common.decode_call_entry(
                call,
                result,
                decode_calls[-1] if decode_calls else None,
                ladder,
                thresholds,
                _fallback(result, thresholds),
                (batch, n_steps, len(rows), lookahead),
                members,
            )
        )
        for step in step_logits:  # step-major, then batch member
            rows.extend(step)
        tokens.extend(int(t) for t in chosen.reshape(-1))
        encoder.append(np.array(features[0].astype(mx.float32)))

    logits = np.stack(rows).astype(np.float32) if rows else np.zeros((0, dims.n_vocab), np.float32)
    if len(logits) != sum(c["n_steps"] * c["batch"] for c in decode_calls) or len(logits) != len(tokens):
        raise CaptureError("logits rows do not add up to the decode calls' steps x batch")
    encoder = np.stack(encoder) if encoder else np.zeros((0, dims.n_audio_ctx, dims.n_audio_state), np.float32)

    waveform_check = None
    if capture.waveforms:
        waveform_check = common.waveform_matches(scenario["audio"], np.array(capture.waveforms[0]))

    eot = capture.calls[0]["eot"] if capture.calls else common.eot("mlx_whisper.tokenizer", model, options)
    audio = {
        "samples": int(capture.waveforms[0].size) if capture.waveforms else None,
        "mel_frames": int(mel.shape[0]),
        "decoded_equals_wav_pcm": waveform_check,
    }
    meta = common.scenario_meta(decode_calls, tokens, eot, transcript, options, thresholds, audio)
    return meta, {"logits": logits, "mel": mel, "encoder": encoder}


def environment():
    return base.mlx_environment("mlx", "mlx-whisper", "tiktoken", "numpy") | common.audio_environment("mlx_whisper")


def main():
    args = base.path_parser("--spec", "--out").parse_args()
    spec = spec_check.checked_spec(args.spec, validate_spec)

    import mlx.core as mx

    tmod = importlib.import_module("mlx_whisper.transcribe")
    model_dir = spec["model_dir"]
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"scenarios": {}}
    loaded_dtype = None
    for scenario in spec["scenarios"]:
        sid = scenario["id"]
        # The loader transcribe uses (and caches) with the dtype transcribe would ask for:
        # float16 when fp16 (mlx-whisper's default), else float32. Its cache keys on the path
        # only, so it is emptied when a scenario needs the other dtype (what a fresh process
        # with that option gets). The weights keep their stored dtype either way.
        dtype = mx.float16 if scenario.get("options", {}).get("fp16", False) else mx.float32
        if loaded_dtype is None or loaded_dtype != dtype:
            tmod.ModelHolder.model = None
        model = tmod.ModelHolder.get_model(model_dir, dtype)
        loaded_dtype = dtype
        common.record_scenario(result, args.out, sid, functools.partial(run_scenario, model_dir, model, scenario))
    result["environment"] = environment()
    (args.out / "result.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
