"""What the whisper oracle generators (mlx-whisper, openai-whisper) share around a transcription:
the run-time patching, the WAV reading, transcribe's defaults and silence skip, the checks of what
a capture (whisper_capture.py) recorded, the per-call and per-scenario records, the
run-twice-and-write loop and the audio part of the environment.

Standard library only at import (numpy is imported inside the functions that need it; every
oracle venv has it); the generators load this file by path.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import shutil
import subprocess
import sys
import wave


@contextlib.contextmanager
def patched(patches):
    """Set each (owner, name, value) for the duration, then put the originals back."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


class CaptureError(RuntimeError):
    """What the wrappers recorded does not add up: the oracle's output would be incomplete."""


def wav_pcm(path):
    """A 16-bit PCM WAV's samples / 32768 as float32 (what ffmpeg decodes these clips to)."""
    import numpy as np

    with wave.open(str(path), "rb") as f:
        pcm = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768.0


def waveform_matches(audio, decoded):
    """Whether the decoded samples (a numpy array) are exactly the WAV's PCM / 32768."""
    import numpy as np

    pcm = wav_pcm(audio)
    return decoded.shape == pcm.shape and np.array_equal(decoded, pcm)


def jsonable(value):
    """Plain JSON types; floats stay Python floats, so json writes their full repr."""
    import numpy as np

    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "tolist"):  # mx.array, torch.Tensor
        return jsonable(value.tolist())
    return value


def transcribe_defaults(transcribe, options):
    """(thresholds, temperature ladder) of a transcribe call: the options', else the function's defaults."""
    import inspect

    params = inspect.signature(transcribe).parameters
    names = ("compression_ratio_threshold", "logprob_threshold", "no_speech_threshold")
    thresholds = {k: options.get(k, params[k].default) for k in names}
    t = options.get("temperature", params["temperature"].default)
    return thresholds, [t] if isinstance(t, (int, float)) else list(t)


def skipped_as_silence(result, thresholds):
    """transcribe's no-speech skip of a window, decided on the attempt it keeps."""
    if thresholds["no_speech_threshold"] is None:
        return False
    skip = result.no_speech_prob > thresholds["no_speech_threshold"]
    if thresholds["logprob_threshold"] is not None and result.avg_logprob > thresholds["logprob_threshold"]:
        skip = False
    return skip


def eot(tokenizer_module, model, options):
    """The end-of-text id of the tokenizer transcribe would use (`tokenizer_module`: the library's)."""
    tok = importlib.import_module(tokenizer_module).get_tokenizer(
        model.is_multilingual, num_languages=model.num_languages, language=options.get("language") or "en"
    )
    return tok.eot


def decode_call_entry(call, result, previous, ladder, thresholds, fallback, shape, members):
    """One decode call's record; `previous` is the record before it (or None), `fallback` the
    library's (needs_fallback, reasons), `shape` (batch, n_steps, row_offset, lookahead_steps),
    `members` each batch member's tokens (cut here at the first EOT)."""
    needs_fallback, reasons = fallback
    batch, n_steps, row_offset, lookahead = shape
    same_window = previous is not None and previous["seek"] == call["window"].get("seek")
    attempt = previous["attempt"] + 1 if same_window and previous["needs_fallback"] else 0
    kept = not needs_fallback or attempt == len(ladder) - 1
    return {
        "seek": call["window"].get("seek"),
        "segment_frames": call["window"].get("segment_size"),
        "attempt": attempt,
        "temperature": float(call["temperature"]),
        "batch": int(batch),
        "initial_tokens": [int(t) for t in call["initial_tokens"]],
        "n_steps": int(n_steps),
        "row_offset": row_offset,
        "lookahead_steps": int(lookahead),
        "member_tokens": [m[: m.index(call["eot"])] if call["eot"] in m else m for m in members],
        "tokens": [int(t) for t in result.tokens],
        "text": result.text,
        "avg_logprob": float(result.avg_logprob),
        "compression_ratio": float(result.compression_ratio),
        "no_speech_prob": float(result.no_speech_prob),
        "needs_fallback": needs_fallback,
        "fallback_reasons": reasons,
        "kept": kept,
        "skipped_as_silence": skipped_as_silence(result, thresholds) if kept else None,
    }


SEGMENT_KEYS = ("id", "seek", "start", "end", "text", "tokens", "temperature", "avg_logprob")
SEGMENT_KEYS += ("compression_ratio", "no_speech_prob", "words")


def scenario_meta(decode_calls, tokens, eot_id, transcript, options, thresholds, audio):
    """A scenario's record in result.json; `audio` is its {samples, mel_frames, decoded_equals_wav_pcm}."""
    return {
        "rendered_prompt": None,
        "prompt_ids": decode_calls[0]["initial_tokens"] if decode_calls else [],
        "tokens": tokens,
        "eos_ids": [int(eot_id)],
        "arrays": ["mel", "encoder"],
        "decode_calls": decode_calls,
        "transcript": jsonable(
            {
                "text": transcript["text"],
                "language": transcript["language"],
                "segments": [{k: s[k] for k in SEGMENT_KEYS if k in s} for s in transcript["segments"]],
            }
        ),
        "options": jsonable(options),
        "thresholds": thresholds,
        "audio": audio,
    }


def scenario_record(capture, model, scenario, options, transcript):
    """What a whisper_capture.CaptureState recorded of `transcript`, checked: (meta, arrays by
    name) ready to write."""
    import numpy as np

    dims = model.dims
    if len(capture.mel) != 1:
        raise CaptureError(f"expected one log_mel_spectrogram call, saw {len(capture.mel)}")
    if capture.stray_logits:
        raise CaptureError(f"{capture.stray_logits} Inference.logits calls outside a decode call")
    mel = capture.mel_array(capture.mel[0])

    transcribe = importlib.import_module(f"{capture.package}.transcribe").transcribe
    thresholds, ladder = transcribe_defaults(transcribe, options)
    decode_calls, rows, tokens, encoder = [], [], [], []
    for index, call in enumerate(capture.calls):
        if len(call["features"]) != 1 or len(call["loop_tokens"]) != 1:
            raise CaptureError(
                f"decode call {index}: expected one encoder pass and one main loop, "
                f"saw {len(call['features'])} and {len(call['loop_tokens'])}"
            )
        (result,) = call["results"]  # transcribe decodes one window at a time
        batch, n_steps, lookahead, step_logits, chosen, members = capture.steps(index, call)
        if any(s.shape != (batch, dims.n_vocab) for s in step_logits):
            raise CaptureError(f"decode call {index}: a logits row is not ({batch}, {dims.n_vocab})")
        features = call["features"][0]
        if tuple(features.shape) != (1, dims.n_audio_ctx, dims.n_audio_state):
            raise CaptureError(f"decode call {index}: encoder output has shape {tuple(features.shape)}")
        previous = decode_calls[-1] if decode_calls else None
        fallback = capture.fallback(result, thresholds)
        shape = (batch, n_steps, len(rows), lookahead)
        decode_calls.append(decode_call_entry(call, result, previous, ladder, thresholds, fallback, shape, members))
        for step in step_logits:  # step-major, then batch member
            rows.extend(step)
        tokens.extend(int(t) for t in chosen.reshape(-1))
        encoder.append(capture.f32(features[0]))

    logits = np.stack(rows).astype(np.float32) if rows else np.zeros((0, dims.n_vocab), np.float32)
    if len(logits) != sum(c["n_steps"] * c["batch"] for c in decode_calls) or len(logits) != len(tokens):
        raise CaptureError("logits rows do not add up to the decode calls' steps x batch")
    encoder = np.stack(encoder) if encoder else np.zeros((0, dims.n_audio_ctx, dims.n_audio_state), np.float32)

    waveform = capture.waveform_array(capture.waveforms[0]) if capture.waveforms else None
    waveform_check = None if waveform is None else waveform_matches(scenario["audio"], waveform)
    eot_id = capture.calls[0]["eot"] if capture.calls else eot(f"{capture.package}.tokenizer", model, options)
    audio = {
        "samples": None if waveform is None else int(waveform.size),
        "mel_frames": int(mel.shape[0]),
        "decoded_equals_wav_pcm": waveform_check,
    }
    meta = scenario_meta(decode_calls, tokens, eot_id, transcript, options, thresholds, audio)
    return meta, {"logits": logits, "mel": mel, "encoder": encoder}


def differences(a, b) -> list[str]:
    """Names of what differs between two runs of a scenario (bits, not values)."""
    (meta_a, arrays_a), (meta_b, arrays_b) = a, b
    differ = [name for name in arrays_a if arrays_a[name].tobytes() != arrays_b[name].tobytes()]
    differ += [k for k in meta_a if json.dumps(meta_a[k], sort_keys=True) != json.dumps(meta_b.get(k), sort_keys=True)]
    return differ


def record_scenario(result, out, sid, run):
    """Run a scenario twice (`run()` gives (meta, arrays by name)); write its arrays to `out` and
    its meta into `result`. A failure is recorded as the scenario's error; two runs that differ
    exit 3 (no golden written)."""
    import numpy as np

    try:
        first = run()
        second = run()
    except Exception as e:  # one scenario the oracle cannot run must not hide the others
        result["scenarios"][sid] = {"error": f"{type(e).__name__}: {e}"}
        print(f"oracle: {sid}: FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return
    # Determinism self-check: a second run must give the same bits, or the golden means nothing.
    differ = differences(first, second)
    if differ:
        print(
            f"oracle is not deterministic on scenario {sid}: two runs differ in {differ}; no golden written",
            file=sys.stderr,
        )
        sys.exit(3)
    meta, arrays = first
    for name, array in arrays.items():
        np.save(out / f"{sid}.{name}.npy", array, allow_pickle=False)
    result["scenarios"][sid] = meta
    print(
        f"oracle: {sid}: {len(meta['decode_calls'])} decode calls, {len(meta['tokens'])} rows: "
        f"{meta['transcript']['text']!r}",
        file=sys.stderr,
        flush=True,
    )


def ffmpeg_version():
    try:
        out = subprocess.run(["ffmpeg", "-version"], capture_output=True, text=True, check=False)
    except OSError:
        return None
    return out.stdout.splitlines()[0] if out.stdout else None


def audio_environment(package):
    """The environment block's audio part: the ffmpeg CLI that `package`.audio.load_audio decodes
    the WAV with, and which loader read it."""
    return {
        "ffmpeg": ffmpeg_version(),
        "audio_loader": f"{package}.audio.load_audio (ffmpeg)" if shutil.which("ffmpeg") else "in-process WAV PCM",
    }
