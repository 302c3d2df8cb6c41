"""The seek loop over a clip's 30-second windows (mlx-whisper's transcribe loop), one window
at a time: clips and prompts, each window's decode call(s) on the temperature ladder, its
segments and word timestamps, and where the next window starts. transcribe.py's docstring
says what it reproduces; `transcribe.transcribe` runs it over a whole clip and
`stream.StreamingTranscriber` as the audio arrives."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import tiktoken

from models.whisper.audio import FRAMES_PER_SECOND, HOP_LENGTH, N_FRAMES, SAMPLE_RATE, pad_or_trim
from models.whisper.decoding import decode
from models.whisper.decoding_types import DecodingOptions, DecodingResult
from models.whisper.fallback import DEFAULT_TEMPERATURES, needs_fallback, should_skip
from models.whisper.hallucination import WindowTimes, skip_hallucination_silence
from models.whisper.hooks import ForcedCall, TranscribeObserver
from models.whisper.language import detect_language
from models.whisper.segments import (
    clear_empty_segments,
    ends_on_single_timestamp,
    last_word_end,
    plain_floats,
    split_segments,
)
from models.whisper.timing import add_word_timestamps
from models.whisper.token_decoders import TemperatureSampler
from models.whisper.tokenizer import LANGUAGES, Tokenizer, get_tokenizer


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
