"""Transcribing a whole clip: mlx-whisper 0.4.3's seek loop over 30-second windows.

The clip's log-Mel is computed once with a window of zero padding; each window is
decoded with the temperature ladder (a result too repetitive — compression ratio above
the threshold — or too improbable — average log-probability below the threshold — is
decoded again at the next temperature, unless the window looks silent); windows the
model calls silent are skipped; otherwise the timestamp tokens cut the text into
segments and decide where the next window starts. Previous text is the next window's
prompt unless conditioning is off or the window needed a temperature above 0.5.

Reproduced as mlx-whisper does it (they change outputs):

- `clip_timestamps`: a later clip does not move `seek` forward to its start; decoding
  goes on from wherever the previous clip stopped. `fix_clip_start=True` jumps to each
  clip's start, as openai-whisper does.
- A segment emptied because it is instantaneous or blank gets a `"words": []` key; others
  have none (without word timestamps).

With `word_timestamps=True` every segment gets its words (`timing.add_word_timestamps`),
and a window that does not end on a single timestamp is cut at its last word's end rather
than at its last timestamp. `hallucination_silence_threshold` (with word timestamps)
skips silence before a stretch of anomalous words, as mlx-whisper does. Word times and the
segment times they move are numpy float64 inside the loop (their rounding is numpy's);
the result holds them as Python floats (an int 0 where the reference clamps to `0`), which
is what the reference's values serialise to.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
import tiktoken

from models.whisper.audio import (
    FRAMES_PER_SECOND,
    HOP_LENGTH,
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
    log_mel_spectrogram,
    pad_or_trim,
)
from models.whisper.decoding import (
    DecodeObserver,
    DecodingOptions,
    DecodingResult,
    TemperatureSampler,
    decode,
    detect_language,
)
from models.whisper.timing import add_word_timestamps
from models.whisper.tokenizer import LANGUAGES, Tokenizer, get_tokenizer

DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
# The words that do not count when judging a segment's words anomalous (mlx-whisper's list:
# the default prepended and appended punctuation, run together; a word is skipped when it is
# a substring of it).
PUNCTUATION = "\"'“¿([{-\"'.。,，!！?？:：”)]}、"


class TranscribeObserver(DecodeObserver):
    """A `DecodeObserver` that also sees the clip's Mel and every decode call's outcome."""

    def on_mel(self, mel: mx.array) -> None:
        pass

    def on_decode_call(self, seek: int, segment_size: int, result: DecodingResult, needs_fallback: bool) -> None:
        pass

    def on_restart(self) -> None:
        """A stream starts its seek loop over (`stream.StreamingTranscriber.finish`): forget the calls seen."""


@dataclass(frozen=True)
class ForcedCall:
    """One decode call of a reference run, replayed: where, at which temperature, which
    tokens (per batch member, its sampled tokens up to its first EOT) and whether the
    reference fell back after it."""

    seek: int
    temperature: float
    member_tokens: Sequence[Sequence[int]]
    needs_fallback: bool


def needs_fallback(
    result: DecodingResult,
    compression_ratio_threshold: float | None,
    logprob_threshold: float | None,
    no_speech_threshold: float | None,
) -> bool:
    """Decode again at the next temperature: too repetitive or too improbable, unless silent."""
    fallback = False
    if compression_ratio_threshold is not None and result.compression_ratio > compression_ratio_threshold:
        fallback = True
    if logprob_threshold is not None and result.avg_logprob < logprob_threshold:
        fallback = True
    if no_speech_threshold is not None and result.no_speech_prob > no_speech_threshold:
        fallback = False
    return fallback


def should_skip(result: DecodingResult, logprob_threshold: float | None, no_speech_threshold: float | None) -> bool:
    """The window is silence: no-speech probability high and average log-probability not."""
    if no_speech_threshold is None:
        return False
    skip = result.no_speech_prob > no_speech_threshold
    if logprob_threshold is not None and result.avg_logprob > logprob_threshold:
        skip = False
    return skip


def parse_clip_timestamps(clip_timestamps: str | Sequence[float], content_frames: int) -> list[tuple[int, int]]:
    """(start, end) frame pairs; a missing last end is the end of the clip."""
    if isinstance(clip_timestamps, str):
        clip_timestamps = [float(ts) for ts in (clip_timestamps.split(",") if clip_timestamps else [])]
    seek_points = [round(ts * FRAMES_PER_SECOND) for ts in clip_timestamps]
    if len(seek_points) == 0:
        seek_points.append(0)
    if len(seek_points) % 2 == 1:
        seek_points.append(content_frames)
    else:
        seek_points[-1] = min(content_frames, seek_points[-1])
    return list(zip(seek_points[::2], seek_points[1::2], strict=True))


@dataclass(frozen=True)
class WindowSegments:
    segments: list[dict[str, Any]]
    seek_advance: int  # frames to move `seek` by


def split_segments(
    tokens: Sequence[int],
    tokenizer: Tokenizer,
    result: DecodingResult,
    *,
    seek: int,
    segment_size: int,
    input_stride: int,
) -> WindowSegments:
    """Cut one window's sampled tokens into segments at consecutive timestamp pairs.

    Ending on a single timestamp means no speech after it: the whole window is consumed.
    Otherwise the unfinished last segment is dropped and the next window starts at the
    last timestamp. Without any pair, the window is one segment, ending at its last
    timestamp when it has one (other than <|0.00|>).
    """
    tokens = np.array(tokens)
    time_offset = float(seek * HOP_LENGTH / SAMPLE_RATE)
    time_precision = input_stride * HOP_LENGTH / SAMPLE_RATE  # seconds per timestamp step
    segment_duration = segment_size * HOP_LENGTH / SAMPLE_RATE
    timestamp_begin = tokenizer.timestamp_begin

    def new_segment(start: float, end: float, segment_tokens: np.ndarray) -> dict[str, Any]:
        token_list = segment_tokens.tolist()
        return {
            "seek": seek,
            "start": start,
            "end": end,
            "text": tokenizer.decode([t for t in token_list if t < tokenizer.eot]),
            "tokens": token_list,
            "temperature": result.temperature,
            "avg_logprob": result.avg_logprob,
            "compression_ratio": result.compression_ratio,
            "no_speech_prob": result.no_speech_prob,
        }

    is_timestamp = tokens >= timestamp_begin
    single_timestamp_ending = is_timestamp[-2:].tolist() == [False, True]
    pair_ends = np.where(np.logical_and(is_timestamp[:-1], is_timestamp[1:]))[0] + 1

    segments = []
    if len(pair_ends) > 0:
        cuts = pair_ends.tolist()
        if single_timestamp_ending:
            cuts.append(len(tokens))
        last_cut = 0
        for cut in cuts:
            piece = tokens[last_cut:cut]
            start_position = piece[0].item() - timestamp_begin
            end_position = piece[-1].item() - timestamp_begin
            segments.append(
                new_segment(
                    time_offset + start_position * time_precision, time_offset + end_position * time_precision, piece
                )
            )
            last_cut = cut
        if single_timestamp_ending:
            advance = segment_size
        else:
            advance = (tokens[last_cut - 1].item() - timestamp_begin) * input_stride
    else:
        duration = segment_duration
        timestamps = tokens[is_timestamp.nonzero()[0]]
        if len(timestamps) > 0 and timestamps[-1].item() != timestamp_begin:
            duration = (timestamps[-1].item() - timestamp_begin) * time_precision
        segments.append(new_segment(time_offset, time_offset + duration, tokens))
        advance = segment_size
    return WindowSegments(segments, advance)


def clear_empty_segments(segments: list[dict[str, Any]]) -> None:
    """An instantaneous or blank segment keeps its times but loses its text and tokens."""
    for segment in segments:
        if segment["start"] == segment["end"] or segment["text"].strip() == "":
            segment["text"] = ""
            segment["tokens"] = []
            segment["words"] = []


def ends_on_single_timestamp(tokens: Sequence[int], tokenizer: Tokenizer) -> bool:
    """The window's tokens end on a text token then one timestamp: no speech after it."""
    is_timestamp = np.array(tokens) >= tokenizer.timestamp_begin
    return is_timestamp[-2:].tolist() == [False, True]


def last_word_end(segments: list[dict[str, Any]]) -> Any:
    """The end of the last word of `segments`; the last segment's end if none has words;
    None without segments."""
    ends = (word["end"] for segment in reversed(segments) for word in reversed(segment["words"]))
    return next(ends, segments[-1]["end"] if segments else None)


def word_anomaly_score(word: dict[str, Any]) -> float:
    """How unlike speech a word looks: improbable, very short or very long."""
    probability = word.get("probability", 0.0)
    duration = word["end"] - word["start"]
    score = 0.0
    if probability < 0.15:
        score += 1.0
    if duration < 0.133:
        score += (0.133 - duration) * 15
    if duration > 2.0:
        score += duration - 2.0
    return score


def is_segment_anomaly(segment: dict[str, Any] | None) -> bool:
    """Its first eight non-punctuation words look like a hallucination."""
    if segment is None or not segment["words"]:
        return False
    words = [word for word in segment["words"] if word["word"] not in PUNCTUATION][:8]
    score = sum(word_anomaly_score(word) for word in words)
    return score >= 3 or score + 0.01 >= len(words)


def next_words_segment(segments: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((segment for segment in segments if segment["words"]), None)


@dataclass(frozen=True)
class WindowTimes:
    """Where one window sits in the clip, in frames and seconds (the seek loop's locals)."""

    seek: int  # the window's first frame (`previous_seek` in the reference)
    segment_size: int  # its frames of audio
    time_offset: float
    window_end_time: float
    segment_duration: float
    content_frames: int
    content_duration: float


def skip_hallucination_silence(
    segments: list[dict[str, Any]],
    window: WindowTimes,
    seek: Any,
    *,
    threshold: float,
    single_timestamp_ending: bool,
    last_speech_timestamp: float,
) -> tuple[Any, bool]:
    """mlx-whisper's `hallucination_silence_threshold` pass over one window's segments.

    Returns the next seek and whether the window is dropped whole (its first worded segment
    is anomalous and starts after more than `threshold` seconds of silence: decoding resumes
    at that segment). Otherwise `segments` may lose its tail from an anomalous segment
    surrounded by silence or more anomalies, and seek moves to that segment.
    """
    if not single_timestamp_ending:
        end = last_word_end(segments)
        if end is not None and end > window.time_offset:
            remaining_duration = window.window_end_time - end
            if remaining_duration > threshold:
                seek = round(end * FRAMES_PER_SECOND)
            else:
                seek = window.seek + window.segment_size

    first_segment = next_words_segment(segments)
    if first_segment is not None and is_segment_anomaly(first_segment):
        gap = first_segment["start"] - window.time_offset
        if gap > threshold:
            return window.seek + round(gap * FRAMES_PER_SECOND), True

    hal_last_end = last_speech_timestamp
    for index, segment in enumerate(segments):
        if not segment["words"]:
            continue
        if is_segment_anomaly(segment):
            next_segment = next_words_segment(segments[index + 1 :])
            if next_segment is not None:
                hal_next_start = next_segment["words"][0]["start"]
            else:
                hal_next_start = window.time_offset + window.segment_duration
            silence_before = (
                segment["start"] - hal_last_end > threshold
                or segment["start"] < threshold
                or segment["start"] - window.time_offset < 2.0
            )
            silence_after = (
                hal_next_start - segment["end"] > threshold
                or is_segment_anomaly(next_segment)
                or window.window_end_time - segment["end"] < 2.0
            )
            if silence_before and silence_after:
                seek = round(max(window.time_offset + 1, segment["start"]) * FRAMES_PER_SECOND)
                if window.content_duration - segment["end"] < threshold:
                    seek = window.content_frames
                segments[index:] = []
                break
        hal_last_end = segment["end"]
    return seek, False


def plain_floats(segments: list[dict[str, Any]]) -> None:
    """numpy scalars in segment and word times (the word-timestamp path) as Python numbers."""
    for segment in segments:
        for key in ("start", "end"):
            if isinstance(segment[key], np.generic):
                segment[key] = segment[key].item()
        for word in segment.get("words", []):
            for key in ("start", "end", "probability"):
                if isinstance(word[key], np.generic):
                    word[key] = word[key].item()


def _format_timestamp(seconds: float) -> str:
    milliseconds = round(seconds * 1000.0)
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    seconds, milliseconds = divmod(milliseconds, 1_000)
    hours_marker = f"{hours:02d}:" if hours > 0 else ""
    return f"{hours_marker}{minutes:02d}:{seconds:02d}.{milliseconds:03d}"


# `parse_clip_timestamps`'s clip length while it is not known (a stream before `finish`).
UNKNOWN_LENGTH = sys.maxsize
WAIT = "wait"  # `SeekLoop.next_window`: the next window needs audio not yet there


class SeekLoop:
    """The seek loop, one window at a time: what mlx-whisper's transcribe keeps between windows.

    `transcribe` runs it over a whole clip at once; `stream.StreamingTranscriber` runs each
    window as soon as its audio exists. Both go through `begin`, `next_window` and
    `run_window`, so batch and streaming share every decision. Keyword arguments are
    `transcribe`'s.
    """

    def __init__(
        self,
        model: Any,
        encoding: tiktoken.Encoding,
        *,
        verbose: bool | None = None,
        temperature: float | tuple[float, ...] = DEFAULT_TEMPERATURES,
        compression_ratio_threshold: float | None = 2.4,
        logprob_threshold: float | None = -1.0,
        no_speech_threshold: float | None = 0.6,
        condition_on_previous_text: bool = True,
        initial_prompt: str | None = None,
        word_timestamps: bool = False,
        prepend_punctuations: str = "\"'“¿([{-",
        append_punctuations: str = "\"'.。,，!！?？:：”)]}、",
        clip_timestamps: str | Sequence[float] = "0",
        hallucination_silence_threshold: float | None = None,
        fix_clip_start: bool = False,
        observer: TranscribeObserver | None = None,
        sampler: TemperatureSampler | None = None,
        forced_calls: Sequence[ForcedCall] | None = None,
        decode_fn: Callable[..., Any] = decode,
        **decode_options: Any,
    ) -> None:
        self.model, self.encoding, self.verbose = model, encoding, verbose
        self.temperature = temperature
        self.compression_ratio_threshold = compression_ratio_threshold
        self.logprob_threshold = logprob_threshold
        self.no_speech_threshold = no_speech_threshold
        self.condition_on_previous_text = condition_on_previous_text
        self.initial_prompt = initial_prompt
        self.word_timestamps = word_timestamps
        self.prepend_punctuations, self.append_punctuations = prepend_punctuations, append_punctuations
        self.clip_timestamps = clip_timestamps
        self.hallucination_silence_threshold = hallucination_silence_threshold
        self.fix_clip_start = fix_clip_start
        self.observer = observer or TranscribeObserver()
        self.sampler = sampler or TemperatureSampler()
        self.forced_calls = forced_calls
        self.decode_fn = decode_fn
        self.decode_options = decode_options
        self.dtype = mx.float16 if decode_options.get("fp16", True) else mx.float32
        self.input_stride = N_FRAMES // model.dims.n_audio_ctx  # mel frames per audio position: 2
        self.forced_cursor = 0  # the next reference decode call, when replaying one
        self.tokenizer: Tokenizer | None = None
        self.all_tokens: list[int] = []
        self.all_segments: list[dict[str, Any]] = []
        self.prompt_reset_since = 0
        self.initial_prompt_tokens: list[int] = []
        self.seek_clips: list[tuple[int, int]] = []
        self.clip = 0  # the clip the loop is in
        self.entered = False  # `fix_clip_start` applied to it
        self.seek = 0
        self.forced_done = False
        self.last_speech_timestamp = 0.0

    @property
    def needs_language_mel(self) -> bool:
        """`begin` detects the language from the clip's first 30 s of Mel."""
        return self.decode_options.get("language", None) is None and self.model.is_multilingual

    @property
    def needs_length(self) -> bool:
        """A window's decisions depend on the clip's length (the hallucination-silence pass)."""
        return self.word_timestamps and self.hallucination_silence_threshold is not None

    def begin(self, first_window: Callable[[], mx.array], content_frames: int | None) -> None:
        """Language, tokenizer, clips and initial prompt. `first_window()` is the clip's first
        `N_FRAMES` Mel frames (asked for only to detect the language); `content_frames` is None
        while the clip's length is not known (`set_length` gives it later)."""
        decode_options = self.decode_options
        if decode_options.get("language", None) is None:
            if not self.model.is_multilingual:
                decode_options["language"] = "en"
            else:
                if self.verbose:
                    print("Detecting language using up to the first 30 seconds.")
                detector = get_tokenizer(self.encoding, multilingual=True, num_languages=self.model.num_languages)
                _, probs = detect_language(self.model, first_window().astype(self.dtype), detector)
                decode_options["language"] = max(probs, key=probs.get)
                if self.verbose is not None:
                    print(f"Detected language: {LANGUAGES[decode_options['language']].title()}")

        language: str = decode_options["language"]
        task: str = decode_options.get("task", "transcribe")
        self.tokenizer = get_tokenizer(
            self.encoding,
            multilingual=self.model.is_multilingual,
            num_languages=self.model.num_languages,
            language=language,
            task=task,
        )
        self.set_length(content_frames)
        if self.word_timestamps and task == "translate":
            warnings.warn("Word-level timestamps on translations may not be reliable.", stacklevel=3)
        if self.initial_prompt is not None:
            self.initial_prompt_tokens = self.tokenizer.encode(" " + self.initial_prompt.strip())
        self.all_tokens.extend(self.initial_prompt_tokens)
        self.seek = self.seek_clips[0][0]

    def set_length(self, content_frames: int | None) -> None:
        """The clip's length in frames (None: not known yet; ends that depend on it wait)."""
        self.content_frames = content_frames
        self.seek_clips = parse_clip_timestamps(
            self.clip_timestamps, UNKNOWN_LENGTH if content_frames is None else content_frames
        )

    def next_window(self, ready_frames: int) -> tuple[int, int] | str | None:
        """`(seek, segment_size)` of the next window, None when the loop is done, or `WAIT`
        when it needs frames past `ready_frames` (only while the clip's length is not known:
        a window is decided once `N_FRAMES` frames past its seek exist, or its clip's end does)."""
        content_frames = self.content_frames
        while self.clip < len(self.seek_clips):
            seek_clip_start, seek_clip_end = self.seek_clips[self.clip]
            if not self.entered:
                if self.fix_clip_start:
                    self.seek = max(self.seek, seek_clip_start)
                self.entered = True
            # Unknown length: an end past the ready frames may be the clip's end, which is at least there.
            end_known = content_frames is not None or seek_clip_end <= ready_frames
            if self.forced_done or (end_known and not self.seek < seek_clip_end):
                self.clip, self.entered = self.clip + 1, False
                continue
            if self.forced_calls is not None:  # follow the reference's windows
                if self.forced_cursor >= len(self.forced_calls):
                    self.forced_done = True
                    continue
                self.seek = self.forced_calls[self.forced_cursor].seek
            if content_frames is not None:
                return self.seek, min(N_FRAMES, content_frames - self.seek, seek_clip_end - self.seek)
            if self.needs_length:
                return WAIT
            if end_known:  # the end is at most the ready frames, so at most the clip's length
                return self.seek, min(N_FRAMES, seek_clip_end - self.seek)
            if self.seek + N_FRAMES <= ready_frames:  # the end is past the ready frames
                return self.seek, N_FRAMES
            return WAIT
        return None

    def decode_with_fallback(self, segment: mx.array, seek: int, segment_size: int) -> DecodingResult:
        temperature = self.temperature
        temperatures = [temperature] if isinstance(temperature, int | float) else temperature
        result = None
        for t in temperatures:
            forced = None
            if self.forced_calls is not None:
                if self.forced_cursor >= len(self.forced_calls):
                    raise ValueError("teacher forcing: the reference run has no more decode calls")
                forced = self.forced_calls[self.forced_cursor]
                self.forced_cursor += 1
                t = forced.temperature
            kwargs = {**self.decode_options}
            if t > 0:  # no beam search when sampling
                kwargs.pop("beam_size", None)
                kwargs.pop("patience", None)
            else:  # no best-of when greedy
                kwargs.pop("best_of", None)
            result = self.decode_fn(
                self.model,
                segment,
                self.encoding,
                DecodingOptions(**kwargs, temperature=t),
                sampler=self.sampler,
                observer=self.observer,
                forced_tokens=forced.member_tokens if forced is not None else None,
            )
            fallback = needs_fallback(
                result, self.compression_ratio_threshold, self.logprob_threshold, self.no_speech_threshold
            )
            self.observer.on_decode_call(seek, segment_size, result, fallback)
            if forced is not None:
                fallback = forced.needs_fallback
            if not fallback:
                break
        return result

    def run_window(self, window_mel: mx.array, seek: int, segment_size: int) -> None:
        """Decode one window (`window_mel`: its `segment_size` Mel frames), cut it into segments
        and move `seek`, as one pass of mlx-whisper's seek loop."""
        assert self.tokenizer is not None, "SeekLoop.begin first"
        tokenizer, content_frames = self.tokenizer, self.content_frames
        mel_segment = pad_or_trim(window_mel, N_FRAMES, axis=-2).astype(self.dtype)

        self.decode_options["prompt"] = self.all_tokens[self.prompt_reset_since :]
        result = self.decode_with_fallback(mel_segment, seek, segment_size)

        if should_skip(result, self.logprob_threshold, self.no_speech_threshold):
            self.seek = seek + segment_size  # silence: on to the next window
            return

        previous_seek = seek
        window = split_segments(
            result.tokens, tokenizer, result, seek=seek, segment_size=segment_size, input_stride=self.input_stride
        )
        seek += window.seek_advance
        current_segments = window.segments

        if self.word_timestamps:
            length = content_frames if content_frames is not None else 0  # only read when it is known
            times = WindowTimes(
                seek=previous_seek,
                segment_size=segment_size,
                time_offset=float(previous_seek * HOP_LENGTH / SAMPLE_RATE),
                window_end_time=float((previous_seek + N_FRAMES) * HOP_LENGTH / SAMPLE_RATE),
                segment_duration=segment_size * HOP_LENGTH / SAMPLE_RATE,
                content_frames=length,
                content_duration=float(length * HOP_LENGTH / SAMPLE_RATE),
            )
            add_word_timestamps(
                segments=current_segments,
                model=self.model,
                tokenizer=tokenizer,
                mel=mel_segment,
                num_frames=segment_size,
                prepend_punctuations=self.prepend_punctuations,
                append_punctuations=self.append_punctuations,
                last_speech_timestamp=self.last_speech_timestamp,
            )
            single_timestamp_ending = ends_on_single_timestamp(result.tokens, tokenizer)
            if not single_timestamp_ending:
                # cut the window at its last word rather than at its last timestamp
                end = last_word_end(current_segments)
                if end is not None and end > times.time_offset:
                    seek = round(end * FRAMES_PER_SECOND)
            if self.hallucination_silence_threshold is not None:
                seek, drop_window = skip_hallucination_silence(
                    current_segments,
                    times,
                    seek,
                    threshold=self.hallucination_silence_threshold,
                    single_timestamp_ending=single_timestamp_ending,
                    last_speech_timestamp=self.last_speech_timestamp,
                )
                if drop_window:
                    self.seek = seek
                    return
            end = last_word_end(current_segments)
            if end is not None:
                self.last_speech_timestamp = end
        self.seek = seek

        if self.verbose:
            for segment in current_segments:
                start, end, text = segment["start"], segment["end"], segment["text"]
                print(f"[{_format_timestamp(start)} --> {_format_timestamp(end)}] {text}")

        clear_empty_segments(current_segments)
        plain_floats(current_segments)
        all_segments = self.all_segments
        all_segments.extend({"id": i, **segment} for i, segment in enumerate(current_segments, start=len(all_segments)))
        self.all_tokens.extend(token for segment in current_segments for token in segment["tokens"])

        if not self.condition_on_previous_text or result.temperature > 0.5:
            # text sampled at a high temperature is a poor prompt
            self.prompt_reset_since = len(self.all_tokens)

    def result(self) -> dict[str, Any]:
        assert self.tokenizer is not None, "SeekLoop.begin first"
        return {
            "text": self.tokenizer.decode(self.all_tokens[len(self.initial_prompt_tokens) :]),
            "segments": self.all_segments,
            "language": self.decode_options["language"],
        }


def transcribe(model: Any, audio: Any, encoding: tiktoken.Encoding, **options: Any) -> dict[str, Any]:
    """Transcribe `audio` (a path or a 16 kHz waveform) with `model`, as mlx_whisper.transcribe.

    `encoding` is the model's vocabulary (`tokenizer.load_encoding`). `options` are
    mlx_whisper.transcribe's keyword arguments (`SeekLoop`'s) and `DecodingOptions` fields.
    `observer` sees the Mel, each decode call's steps and outcome. `forced_calls` replays a
    reference run: decode call i starts at `forced_calls[i].seek`, runs at its temperature,
    is fed its tokens, and falls back as the reference did; everything else is computed as
    usual. `decode_fn` runs one decode call (`decoding.decode`'s signature): the fast path
    passes its own.

    `prepend_punctuations`, `append_punctuations` and `hallucination_silence_threshold`
    only act with word timestamps, as in mlx_whisper.transcribe.

    Returns `{"text", "segments", "language"}`.
    """
    loop = SeekLoop(model, encoding, **options)
    # A whole window of zero padding after the clip, so every window can be sliced full.
    mel = log_mel_spectrogram(audio, n_mels=model.dims.n_mels, padding=N_SAMPLES)
    loop.observer.on_mel(mel)
    content_frames = mel.shape[-2] - N_FRAMES
    loop.begin(lambda: pad_or_trim(mel, N_FRAMES, axis=-2), content_frames)
    while (window := loop.next_window(content_frames)) is not None:
        assert window != WAIT, "a clip of known length never waits"
        seek, segment_size = window
        loop.run_window(mel[seek : seek + segment_size], seek, segment_size)
    return loop.result()
