"""The capture of the whisper oracle generators (mlx-whisper, openai-whisper): wrappers around a
whisper library's functions that record what one transcription computed, and that library's
fallback decision for a decode attempt. Checking and writing what was recorded is whisper_run's.

Standard library only at import (numpy is imported inside the functions that need it; every
oracle venv has it); the generators load this file by path.
"""

from __future__ import annotations

import importlib
import shutil
import sys


class CaptureState:
    """What one transcription computed, as a library's wrappers record it.

    A generator's subclass names its library: `package` (its audio, decoding, transcribe and
    tokenizer modules), the `inference` class whose logits and the `decoders` whose updates are
    wrapped. It gives `pcm(path)`, load_audio's samples where there is no ffmpeg CLI, and, for
    whisper_run.scenario_record, `steps(index, call)` (a decode call's kept steps, checked:
    batch, n_steps, lookahead, step logits, chosen tokens, member tokens) and `f32(array)`.
    """

    package = ""
    inference = "Inference"
    decoders = ("GreedyDecoder",)
    # openai-whisper lets a high no-speech probability override a retry only together with a
    # log-probability below the threshold; mlx-whisper on the no-speech probability alone.
    no_speech_override_needs_low_logprob = False

    def __init__(self):
        self.mel = []  # log_mel_spectrogram outputs (transcribe calls it once)
        self.waveforms = []  # load_audio outputs
        self.calls = []  # one dict per DecodingTask.run
        self.current = None
        self.stray_logits = 0  # Inference.logits calls outside a decode call (none expected)

    def keep(self, kind, value):
        """What is recorded of a captured `value` ("mel", "features", "loop_tokens", "rows" or
        "chosen"): the value itself, unless the library writes into it afterwards."""
        return value

    def call_extra(self, task):
        """More of a decode call's record, beside what every library's has."""
        return {}

    def mel_array(self, mel):
        """The log-mel spectrogram as a numpy (frames, n_mels) float32 array."""
        return self.f32(mel)

    def waveform_array(self, waveform):
        import numpy as np

        return np.asarray(waveform)

    def patches(self):
        """The (owner, name, wrapper) patches (for whisper_run.patched) that record a transcription."""
        audio = importlib.import_module(f"{self.package}.audio")
        decoding = importlib.import_module(f"{self.package}.decoding")
        tmod = importlib.import_module(f"{self.package}.transcribe")
        transcribe_code = tmod.transcribe.__code__
        cap = self
        inference_class = getattr(decoding, self.inference)
        orig_mel, orig_load = tmod.log_mel_spectrogram, audio.load_audio
        orig_run, orig_features = decoding.DecodingTask.run, decoding.DecodingTask._get_audio_features
        orig_loop, orig_logits = decoding.DecodingTask._main_loop, inference_class.logits

        def log_mel_spectrogram(*args, **kwargs):
            out = orig_mel(*args, **kwargs)
            cap.mel.append(cap.keep("mel", out))
            return out

        def load_audio(*args, **kwargs):
            out = cap.pcm(args[0]) if shutil.which("ffmpeg") is None else orig_load(*args, **kwargs)
            cap.waveforms.append(out)
            return out

        def run(task, mel):
            call = {
                "window": seek_window(transcribe_code),
                "temperature": task.options.temperature,
                **cap.call_extra(task),
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
                cap.current["features"].append(cap.keep("features", out))
            return out

        def main_loop(task, audio_features, tokens):
            out = orig_loop(task, audio_features, tokens)
            if cap.current is not None:
                cap.current["loop_tokens"].append(cap.keep("loop_tokens", out[0]))
            return out

        def logits(inference, tokens, audio_features):
            out = orig_logits(inference, tokens, audio_features)
            if cap.current is None:
                cap.stray_logits += 1
            else:
                cap.current["rows"].append(cap.keep("rows", out[:, -1, :]))
            return out

        def update_wrapper(orig):
            def update(decoder, tokens, logits, sum_logprobs):
                out = orig(decoder, tokens, logits, sum_logprobs)
                if cap.current is not None:
                    cap.current["chosen"].append(cap.keep("chosen", out[0][:, -1]))
                return out

            return update

        decoders = [getattr(decoding, name) for name in self.decoders]
        return [
            (tmod, "log_mel_spectrogram", log_mel_spectrogram),
            (audio, "load_audio", load_audio),
            (decoding.DecodingTask, "run", run),
            (decoding.DecodingTask, "_get_audio_features", get_audio_features),
            (decoding.DecodingTask, "_main_loop", main_loop),
            (inference_class, "logits", logits),
            *[(decoder, "update", update_wrapper(decoder.update)) for decoder in decoders],
        ]

    def fallback(self, result, thresholds):
        """transcribe's decode_with_fallback decision for one attempt: (needs_fallback, reasons)."""
        reasons = []
        if thresholds["compression_ratio_threshold"] is not None:
            if result.compression_ratio > thresholds["compression_ratio_threshold"]:
                reasons.append("compression_ratio")  # too repetitive
        if thresholds["logprob_threshold"] is not None:
            if result.avg_logprob < thresholds["logprob_threshold"]:
                reasons.append("avg_logprob")  # too improbable
        needs = bool(reasons)
        no_speech, logprob = thresholds["no_speech_threshold"], thresholds["logprob_threshold"]
        silent = no_speech is not None and result.no_speech_prob > no_speech
        if silent and self.no_speech_override_needs_low_logprob:
            silent = logprob is not None and result.avg_logprob < logprob
        if silent:
            needs = False  # taken for silence: no retry
            if reasons:
                reasons.append("overridden_by_no_speech")
        return needs, reasons


def seek_window(transcribe_code):
    """Where transcribe's seek loop stands ({seek, segment_size}), read from its frame up the stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is transcribe_code:
            return {k: frame.f_locals.get(k) for k in ("seek", "segment_size")}
        frame = frame.f_back
    return {}
