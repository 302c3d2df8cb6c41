"""Transcript writers: txt, vtt, srt, tsv and json files, byte for byte as mlx-whisper 0.4.3's.

`get_writer(format, output_dir)` returns a callable `(result, output_name, options=None,
**kwargs)` that writes `<output_dir>/<output_name with its suffix replaced>.<format>`
(UTF-8, "\\n" line ends); `"all"` writes every format. The subtitle writers (vtt, srt) take
mlx-whisper's word options, as keyword arguments or in `options` (a keyword argument wins
when truthy): `max_line_width`, `max_line_count`, `highlight_words`, `max_words_per_line`.
They only act when the first segment has a `words` key (a word-timestamp transcript).

Reproduced as mlx-whisper does it (they change bytes):

- Timestamps are `round(seconds * 1000)` integer milliseconds (Python's round, half to
  even), then hours (always in srt, when non-zero in vtt), minutes, seconds and the
  decimal marker ("," in srt, "." in vtt).
- Segments are kept as subtitles unless both `max_line_width` and `max_line_count` are set;
  then a subtitle breaks after `max_line_count` lines or at a pause over 3 s.
- `max_words_per_line` cuts each segment's words into chunks; a chunk's first word counts
  as a segment's first word, so with segments preserved every chunk is its own cue.
- `highlight_words` repeats a subtitle once per word with that word underlined (`<u>`),
  filling the gaps between words with the plain subtitle.
- Without words, a segment's text is stripped and "-->" becomes "->" (vtt, srt); tsv puts
  `round(1000 * start)`, `round(1000 * end)` and the stripped text with tabs as spaces;
  txt puts each stripped segment text on a line; json is `json.dump(result,
  ensure_ascii=False)`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

FORMATS = ("txt", "vtt", "srt", "tsv", "json")
WORD_OPTIONS = ("max_line_width", "max_line_count", "highlight_words", "max_words_per_line")
# A long pause between words starts a new subtitle (when lines are being packed).
LONG_PAUSE_SECONDS = 3.0
_UNLIMITED = 1000  # the width / words-per-line that stands for "no limit"
_LEADING_SPACE_AND_REST = re.compile(r"^(\s*)(.*)$")


def format_timestamp(seconds: float, always_include_hours: bool = False, decimal_marker: str = ".") -> str:
    """`[HH:]MM:SS<marker>mmm` of `seconds` (non-negative), milliseconds rounded half to even."""
    if not seconds >= 0:
        raise ValueError(f"timestamp: expected a non-negative number of seconds, got {seconds!r}")
    total_ms = round(seconds * 1000.0)
    hours, rest = divmod(total_ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole_seconds, milliseconds = divmod(rest, 1_000)
    hours_marker = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{hours_marker}{minutes:02d}:{whole_seconds:02d}{decimal_marker}{milliseconds:03d}"


def first_start(segments: list[dict[str, Any]]) -> float | None:
    """The first word's start; the first segment's start if no segment has words."""
    starts = (word["start"] for segment in segments for word in segment["words"])
    return next(starts, segments[0]["start"] if segments else None)


class ResultWriter:
    """Writes one format of a transcript to `<output_dir>/<name>.<extension>`."""

    extension: str

    def __init__(self, output_dir: str | Path):
        self.output_dir = output_dir

    def __call__(self, result: dict[str, Any], output_name: str, options: dict[str, Any] | None = None, **kwargs: Any):
        path = (Path(self.output_dir) / output_name).with_suffix(f".{self.extension}")
        # newline="\n": the same bytes on every platform (mlx-whisper writes through the
        # platform's text mode; on Linux and macOS that is "\n").
        with path.open("w", encoding="utf-8", newline="\n") as file:
            self.write_result(result, file=file, options=options, **kwargs)

    def write_result(
        self, result: dict[str, Any], file: TextIO, options: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        raise NotImplementedError


class WriteTXT(ResultWriter):
    extension = "txt"

    def write_result(
        self, result: dict[str, Any], file: TextIO, options: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        for segment in result["segments"]:
            file.write(segment["text"].strip() + "\n")


def _pack_subtitles(
    segments: list[dict[str, Any]],
    *,
    max_line_width: int,
    max_line_count: int | None,
    max_words_per_line: int,
    preserve_segments: bool,
) -> Iterator[list[dict[str, Any]]]:
    """Group the words of `segments` into subtitles: lists of word dicts (copies) whose
    `word` carries the text to print ("\\n" before a word that starts a new line)."""
    line_len = 0
    line_count = 1
    subtitle: list[dict[str, Any]] = []
    last_start = first_start(segments) or 0.0
    for segment in segments:
        words = segment["words"]
        chunk_start = 0
        chunk_length = max_words_per_line
        while chunk_start < len(words):
            # The last chunk holds what is left.
            if max_words_per_line > len(words) - chunk_start:
                chunk_length = len(words) - chunk_start
            for position, original in enumerate(words[chunk_start : chunk_start + chunk_length]):
                timing = dict(original)
                long_pause = not preserve_segments and timing["start"] - last_start > LONG_PAUSE_SECONDS
                has_room = line_len + len(timing["word"]) <= max_line_width
                segment_break = position == 0 and len(subtitle) > 0 and preserve_segments
                if line_len > 0 and has_room and not long_pause and not segment_break:
                    line_len += len(timing["word"])  # the word continues the line
                else:
                    timing["word"] = timing["word"].strip()
                    subtitle_full = max_line_count is not None and (long_pause or line_count >= max_line_count)
                    if (len(subtitle) > 0 and subtitle_full) or segment_break:
                        yield subtitle
                        subtitle = []
                        line_count = 1
                    elif line_len > 0:
                        line_count += 1
                        timing["word"] = "\n" + timing["word"]
                    line_len = len(timing["word"].strip())
                subtitle.append(timing)
                last_start = timing["start"]
            chunk_start += max_words_per_line
    if len(subtitle) > 0:
        yield subtitle


def _underline(word: str) -> str:
    """`word` with all but its leading whitespace wrapped in <u></u> (unchanged if the
    rest spans lines)."""
    return _LEADING_SPACE_AND_REST.sub(r"\1<u>\2</u>", word)


class SubtitlesWriter(ResultWriter):
    always_include_hours: bool
    decimal_marker: str

    header: str  # written once before the cues

    def format_timestamp(self, seconds: float) -> str:
        return format_timestamp(seconds, self.always_include_hours, self.decimal_marker)

    def cue(self, number: int, start: str, end: str, text: str) -> str:
        raise NotImplementedError

    def write_result(
        self, result: dict[str, Any], file: TextIO, options: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        file.write(self.header)
        for number, (start, end, text) in enumerate(self.iterate_result(result, options, **kwargs), start=1):
            file.write(self.cue(number, start, end, text))

    def iterate_result(
        self,
        result: dict[str, Any],
        options: dict[str, Any] | None = None,
        *,
        max_line_width: int | None = None,
        max_line_count: int | None = None,
        highlight_words: bool = False,
        max_words_per_line: int | None = None,
    ) -> Iterator[tuple[str, str, str]]:
        """(start, end, text) of each cue."""
        options = options or {}
        max_line_width = max_line_width or options.get("max_line_width")
        max_line_count = max_line_count or options.get("max_line_count")
        highlight_words = highlight_words or options.get("highlight_words", False)
        max_words_per_line = max_words_per_line or options.get("max_words_per_line")
        segments = result["segments"]

        if not (len(segments) > 0 and "words" in segments[0]):
            for segment in segments:
                text = segment["text"].strip().replace("-->", "->")
                yield self.format_timestamp(segment["start"]), self.format_timestamp(segment["end"]), text
            return

        subtitles = _pack_subtitles(
            segments,
            max_line_width=max_line_width or _UNLIMITED,
            max_line_count=max_line_count,
            max_words_per_line=max_words_per_line or _UNLIMITED,
            preserve_segments=max_line_count is None or max_line_width is None,
        )
        for subtitle in subtitles:
            start = self.format_timestamp(subtitle[0]["start"])
            end = self.format_timestamp(subtitle[-1]["end"])
            text = "".join(word["word"] for word in subtitle)
            if not highlight_words:
                yield start, end, text
                continue
            shown_until = start
            texts = [word["word"] for word in subtitle]
            for index, word in enumerate(subtitle):
                word_start, word_end = self.format_timestamp(word["start"]), self.format_timestamp(word["end"])
                if shown_until != word_start:  # the gap before this word: the plain subtitle
                    yield shown_until, word_start, text
                highlighted = texts[:index] + [_underline(texts[index])] + texts[index + 1 :]
                yield word_start, word_end, "".join(highlighted)
                shown_until = word_end


class WriteVTT(SubtitlesWriter):
    extension, always_include_hours, decimal_marker, header = "vtt", False, ".", "WEBVTT\n\n"

    def cue(self, number: int, start: str, end: str, text: str) -> str:
        return f"{start} --> {end}\n{text}\n\n"


class WriteSRT(SubtitlesWriter):
    extension, always_include_hours, decimal_marker, header = "srt", True, ",", ""

    def cue(self, number: int, start: str, end: str, text: str) -> str:
        return f"{number}\n{start} --> {end}\n{text}\n\n"


class WriteTSV(ResultWriter):
    """`start<TAB>end<TAB>text` lines under a header; times in integer milliseconds (no
    decimal separator for a locale to change)."""

    extension = "tsv"

    def write_result(
        self, result: dict[str, Any], file: TextIO, options: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        file.write("start\tend\ttext\n")
        for segment in result["segments"]:
            text = segment["text"].strip().replace("\t", " ")
            file.write(f"{round(1000 * segment['start'])}\t{round(1000 * segment['end'])}\t{text}\n")


class WriteJSON(ResultWriter):
    extension = "json"

    def write_result(
        self, result: dict[str, Any], file: TextIO, options: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        json.dump(result, file, ensure_ascii=False)


WRITERS: dict[str, type[ResultWriter]] = {
    "txt": WriteTXT,
    "vtt": WriteVTT,
    "srt": WriteSRT,
    "tsv": WriteTSV,
    "json": WriteJSON,
}


def get_writer(output_format: str, output_dir: str | Path) -> Callable[..., None]:
    """The writer of `output_format` (one of FORMATS, or "all" for every one of them)."""
    if output_format == "all":
        writers = [writer(output_dir) for writer in WRITERS.values()]

        def write_all(
            result: dict[str, Any], output_name: str, options: dict[str, Any] | None = None, **kwargs: Any
        ) -> None:
            for writer in writers:
                writer(result, output_name, options, **kwargs)

        return write_all
    if output_format not in WRITERS:
        raise ValueError(f"output format {output_format!r}: expected one of {', '.join(FORMATS)} or 'all'")
    return WRITERS[output_format](output_dir)
