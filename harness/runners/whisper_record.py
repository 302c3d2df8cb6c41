"""The harness's Whisper record: one instrumented transcription, everything the parity check
compares. The layout is the harness's; the in-tree Whisper only offers its instrumentation
interface (models/whisper/hooks.py: observers, teacher forcing, the sampler, `decode_fn`).

`transcribe_record` runs `transcribe.transcribe` with a recording observer and returns
plain data (numpy arrays, lists, Python floats), in the layout of the mlx-whisper oracle
generator's records:

- `mel`: the clip's log-Mel as transcription computes it (`[frames, n_mels]` float32,
  a window of zero padding included);
- `encoder`: `[n_calls, n_audio_ctx, n_audio_state]` float32, each decode call's audio
  features in call order (a fallback re-encodes the same window, as mlx-whisper does);
- `logits`: `[N, n_vocab]` float32, every kept decoder step's last-position logits
  before the filters, one row per (decode call, step, batch member) in that order (the
  step the loop computes past the end and drops is counted in `lookahead_steps`, not
  recorded);
- `tokens`: N token ids, the token appended after each row (EOT for an ended sequence);
- `eos_ids`: `[eot]`;
- `decode_calls`: per call `seek`, `segment_frames`, `attempt` (its place on the
  temperature ladder), `temperature`, `batch`, `initial_tokens`, `n_steps`, `row_offset`
  (its first row in `logits`), `lookahead_steps`, `member_tokens` (per batch member, up
  to its first EOT), `tokens` and `text` (the ranked result), `avg_logprob`,
  `compression_ratio`, `no_speech_prob`, `needs_fallback`, `fallback_reasons`, `kept`,
  `skipped_as_silence` (None unless kept);
- `transcript`: `text`, `language`, and the segments' mlx-whisper fields (`words` only
  where mlx-whisper sets it: on emptied segments).

`options` are mlx_whisper.transcribe's keyword arguments plus `seed` (`mx.random.seed`
right before transcribing). Sampling starts from a fresh compiled sampler each record
(see `token_decoders.TemperatureSampler`): the run equals mlx-whisper's in a fresh process,
or in one whose compiled sampler was replaced before the run, seeded the same way.
`forced` (a reference record's `decode_calls`) replays the reference's windows,
temperatures, tokens and fallback decisions (teacher forcing). `fast_transcribe_record` is
the same record on the fast path (models/whisper/fast.py), with what the fast path decided.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from models.whisper.audio import load_audio
from models.whisper.decoding import decode
from models.whisper.decoding_types import DecodingResult
from models.whisper.fallback import DEFAULT_TEMPERATURES, should_skip
from models.whisper.fast import fast_decode
from models.whisper.fast_model import FastWhisper, as_fast
from models.whisper.hooks import ForcedCall, TranscribeObserver
from models.whisper.model import Whisper
from models.whisper.token_decoders import TemperatureSampler
from models.whisper.tokenizer import load_encoding
from models.whisper.transcribe import transcribe

SEGMENT_FIELDS = (
    "id",
    "seek",
    "start",
    "end",
    "text",
    "tokens",
    "temperature",
    "avg_logprob",
    "compression_ratio",
    "no_speech_prob",
    "words",
)
_THRESHOLD_DEFAULTS = {"compression_ratio_threshold": 2.4, "logprob_threshold": -1.0, "no_speech_threshold": 0.6}


def fallback_reasons(result: DecodingResult, thresholds: dict[str, float | None]) -> list[str]:
    """Why transcribe's ladder would move on after `result` ("overridden_by_no_speech": it does not)."""
    reasons = []
    limit = thresholds["compression_ratio_threshold"]
    if limit is not None and result.compression_ratio > limit:
        reasons.append("compression_ratio")
    limit = thresholds["logprob_threshold"]
    if limit is not None and result.avg_logprob < limit:
        reasons.append("avg_logprob")
    limit = thresholds["no_speech_threshold"]
    if reasons and limit is not None and result.no_speech_prob > limit:
        reasons.append("overridden_by_no_speech")
    return reasons


class TranscriptionRecorder(TranscribeObserver):
    """Collects the Mel, audio features, per-step logits and tokens, and decode calls."""

    def __init__(self, thresholds: dict[str, float | None], ladder_length: int, eot: int) -> None:
        self.thresholds = thresholds
        self.ladder_length = ladder_length
        self.eot = eot
        self.mel: np.ndarray | None = None
        self.encoder: list[np.ndarray] = []
        self.logits: list[np.ndarray] = []
        self.tokens: list[int] = []
        self.decode_calls: list[dict[str, Any]] = []
        self._call: dict[str, Any] | None = None

    def on_mel(self, mel: mx.array) -> None:
        self.mel = np.array(mel.astype(mx.float32))

    def on_restart(self) -> None:
        self.encoder, self.logits, self.tokens, self.decode_calls, self._call = [], [], [], [], None

    def on_audio_features(self, audio_features: mx.array) -> None:
        if audio_features.shape[0] != 1:
            raise ValueError(f"recording expects one window per decode call, got {audio_features.shape[0]}")
        self.encoder.append(np.array(audio_features[0].astype(mx.float32)))

    def on_decode_begin(self, initial_tokens: tuple[int, ...], n_batch: int, temperature: float) -> None:
        self._call = {
            "temperature": float(temperature),
            "batch": n_batch,
            "initial_tokens": list(initial_tokens),
            "n_steps": 0,
            "row_offset": len(self.tokens),
            "lookahead_steps": 0,
            "chosen": [[] for _ in range(n_batch)],
        }

    def on_step(self, logits: mx.array, tokens: mx.array, kept: bool) -> None:
        call = self._call
        assert call is not None, "a decode step outside a decode call"
        if not kept:
            call["lookahead_steps"] += 1
            return
        self.logits.append(np.array(logits.astype(mx.float32)))
        chosen = [int(t) for t in tokens.tolist()]
        self.tokens.extend(chosen)
        for member, token in zip(call["chosen"], chosen, strict=True):
            member.append(token)
        call["n_steps"] += 1

    def on_candidates(self, tokens: list[list[list[int]]], sum_logprobs: list[list[float]]) -> None:
        call = self._call
        assert call is not None and len(tokens) == 1, "beam candidates outside a one-window decode call"
        call["candidates"] = [
            {"tokens": [int(t) for t in seq], "sum_logprob": float(total)}
            for seq, total in zip(tokens[0], sum_logprobs[0], strict=True)
        ]

    def on_decode_call(self, seek: int, segment_size: int, result: DecodingResult, needs_fallback: bool) -> None:
        call, self._call = self._call, None
        assert call is not None, "a decode call ended that never began"
        previous = self.decode_calls[-1] if self.decode_calls else None
        retry = previous is not None and previous["seek"] == seek and previous["needs_fallback"]
        attempt = previous["attempt"] + 1 if retry else 0
        kept = not needs_fallback or attempt == self.ladder_length - 1
        members = call.pop("chosen")
        self.decode_calls.append(
            {
                "seek": int(seek),
                "segment_frames": int(segment_size),
                "attempt": attempt,
                "temperature": call["temperature"],
                "batch": call["batch"],
                "initial_tokens": call["initial_tokens"],
                "n_steps": call["n_steps"],
                "row_offset": call["row_offset"],
                "lookahead_steps": call["lookahead_steps"],
                "member_tokens": [m[: m.index(self.eot)] if self.eot in m else m for m in members],
                "tokens": [int(t) for t in result.tokens],
                "text": result.text,
                "avg_logprob": float(result.avg_logprob),
                "compression_ratio": float(result.compression_ratio),
                "no_speech_prob": float(result.no_speech_prob),
                "needs_fallback": bool(needs_fallback),
                "fallback_reasons": fallback_reasons(result, self.thresholds),
                "kept": kept,
                "skipped_as_silence": (
                    should_skip(result, self.thresholds["logprob_threshold"], self.thresholds["no_speech_threshold"])
                    if kept
                    else None
                ),
            }
            | ({"candidates": call["candidates"]} if "candidates" in call else {})
        )

    def stacked_logits(self, n_vocab: int) -> np.ndarray:
        if not self.logits:
            return np.zeros((0, n_vocab), np.float32)
        return np.concatenate(self.logits, axis=0)


def forced_calls_from_record(decode_calls: list[dict[str, Any]]) -> list[ForcedCall]:
    return [
        ForcedCall(
            seek=int(call["seek"]),
            temperature=float(call["temperature"]),
            member_tokens=[[int(t) for t in member] for member in call["member_tokens"]],
            needs_fallback=bool(call["needs_fallback"]),
        )
        for call in decode_calls
    ]


def _prepare(
    model: Any, model_dir: str | Path, options: dict[str, Any], recorder_class: type[TranscriptionRecorder] | None
) -> tuple[dict[str, Any], int | None, Any, TranscriptionRecorder]:
    """transcribe's options (a list of temperatures as a tuple), the seed, the encoding and a recorder."""
    options = dict(options)
    seed = options.pop("seed", None)
    if isinstance(options.get("temperature"), list):
        options["temperature"] = tuple(options["temperature"])
    temperature = options.get("temperature", DEFAULT_TEMPERATURES)
    ladder_length = 1 if isinstance(temperature, int | float) else len(temperature)
    thresholds = {name: options.get(name, default) for name, default in _THRESHOLD_DEFAULTS.items()}
    encoding = load_encoding(model_dir, model.num_languages, model.dims.n_vocab)
    recorder = (recorder_class or TranscriptionRecorder)(thresholds, ladder_length, encoding.eot_token)
    return options, seed, encoding, recorder


def _record(model: Any, encoding: Any, recorder: TranscriptionRecorder, result: dict[str, Any]) -> dict[str, Any]:
    n_audio_ctx, n_audio_state = model.dims.n_audio_ctx, model.dims.n_audio_state
    encoder = np.stack(recorder.encoder) if recorder.encoder else np.zeros((0, n_audio_ctx, n_audio_state), np.float32)
    # Keyword arguments, not a dict display: these are the record's fields, some of them named
    # like checks (tests/test_layout.py reads a literal holding two check names as a stray list).
    return dict(
        mel=recorder.mel,
        encoder=encoder,
        logits=recorder.stacked_logits(model.dims.n_vocab),
        tokens=recorder.tokens,
        eos_ids=[encoding.eot_token],
        decode_calls=recorder.decode_calls,
        transcript={
            "text": result["text"],
            "language": result["language"],
            "segments": [{key: seg[key] for key in SEGMENT_FIELDS if key in seg} for seg in result["segments"]],
        },
    )


def transcribe_record(
    model: Any,
    model_dir: str | Path,
    audio_path: str | Path,
    options: dict[str, Any],
    forced: list[dict[str, Any]] | None = None,
    *,
    decode_fn: Callable[..., Any] = decode,
    recorder_class: type[TranscriptionRecorder] | None = None,
) -> dict[str, Any]:
    """Transcribe `audio_path` with `model` (loaded from `model_dir`) and record every stage.

    `decode_fn` runs each decode call (the fast path passes its own, with its model and a
    recorder class that also keeps what it decided)."""
    options, seed, encoding, recorder = _prepare(model, model_dir, options, recorder_class)
    forced_calls = forced_calls_from_record(forced) if forced is not None else None

    if seed is not None:
        mx.random.seed(seed)
    result = transcribe(
        model,
        str(audio_path),
        encoding,
        observer=recorder,
        sampler=TemperatureSampler(),
        forced_calls=forced_calls,
        decode_fn=decode_fn,
        **options,
    )
    return _record(model, encoding, recorder, result)


def streamed_transcribe_record(
    model: Any, model_dir: str | Path, audio_path: str | Path, options: dict[str, Any], chunk_samples: int
) -> dict[str, Any]:
    """`transcribe_record`'s record of a `stream.StreamingTranscriber` fed the clip's samples in
    chunks of `chunk_samples`, plus `stream`: windows decoded before `finish`, restarts, chunks."""
    from models.whisper.stream import StreamingTranscriber

    if chunk_samples <= 0:
        raise ValueError(f"chunk_samples must be positive, got {chunk_samples}")
    options, seed, encoding, recorder = _prepare(model, model_dir, options, None)
    samples = np.array(load_audio(audio_path))
    stream = StreamingTranscriber(model, encoding, seed=seed, observer=recorder, **options)
    for offset in range(0, samples.size, chunk_samples):
        stream.feed(samples[offset : offset + chunk_samples])
    record = _record(model, encoding, recorder, stream.finish())
    record["stream"] = {
        "chunks": -(-samples.size // chunk_samples),
        "windows_before_finish": stream.windows_before_finish,
        "restarts": stream.restarts,
    }
    return record


def fast_transcribe_record(
    model: Whisper | FastWhisper,
    model_dir: str | Path,
    audio_path: str | Path,
    options: dict[str, Any],
    forced: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """`transcribe_record` on the fast path: the same record, and per decode call
    `fast_filters` (the call's filters, `FastFilters.to_dict`) and `fast_picks` (per kept
    step, per batch member, the fast path's own pick: under teacher forcing what it would
    have appended) where the fast path decoded (absent where it delegated)."""
    return transcribe_record(
        as_fast(model), model_dir, audio_path, options, forced, decode_fn=fast_decode, recorder_class=_FastRecorder
    )


class _FastRecorder(TranscriptionRecorder):
    """`TranscriptionRecorder` plus the fast path's filters and picks per decode call."""

    def on_decode_begin(self, initial_tokens: tuple[int, ...], n_batch: int, temperature: float) -> None:
        super().on_decode_begin(initial_tokens, n_batch, temperature)
        self._fast: dict[str, Any] = {}

    def on_fast_filters(self, filters: dict[str, Any]) -> None:
        self._fast["fast_filters"] = filters
        self._fast["fast_picks"] = []

    def on_fast_step(self, picks: mx.array, kept: bool) -> None:
        if kept:
            self._fast["fast_picks"].append([int(t) for t in picks.tolist()])

    def on_decode_call(self, seek: int, segment_size: int, result: DecodingResult, needs_fallback: bool) -> None:
        super().on_decode_call(seek, segment_size, result, needs_fallback)
        self.decode_calls[-1].update(self._fast)
