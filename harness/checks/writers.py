"""The `writers` gate: the in-tree transcript writers must write the bytes mlx-whisper writes.

The oracle side runs `oracles/mlx-whisper/writers.py` in the mlx-whisper venv on the
golden's transcript (mlx_whisper.writers.get_writer, every format); the in-tree side runs
`models.whisper.writers` on the in-tree transcript. Every format (txt, vtt, srt, tsv, json)
is compared byte for byte, for each set of writer options. A difference names the format,
the option set, the byte offset and the first differing line on both sides.

The transcripts usually agree already (the `transcript` gate judges them); this gate adds
the formatting: timestamp rounding and markers, line packing, highlighting, JSON text.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.checks.compare import CheckResult
from harness.errors import OracleError
from harness.oracle.process import OracleProcess
from harness.paths import cache_root
from harness.progress import progress

FORMATS = ("txt", "vtt", "srt", "tsv", "json")
WORD_OPTIONS = frozenset({"max_line_width", "max_line_count", "highlight_words", "max_words_per_line"})
# The option sets worth judging on a word-timestamp transcript: each of mlx-whisper's
# subtitle code paths (segments kept; lines packed by width and count; words per line;
# highlighting, alone and with packing). Without words they all reduce to the first.
WORD_OPTION_SETS: tuple[dict[str, Any], ...] = (
    {},
    {"max_line_width": 20, "max_line_count": 2},
    {"max_line_width": 12},
    {"max_words_per_line": 3},
    {"max_words_per_line": 2, "max_line_width": 12, "max_line_count": 2},
    {"highlight_words": True},
    {"highlight_words": True, "max_line_width": 24, "max_line_count": 2},
)

# Writes every format of a transcript for each option set i into `<folder>/<i>/`:
# (transcript, folder, output name, option sets).
WriteAll = Callable[[Mapping[str, Any], Path, str, Sequence[Mapping[str, Any]]], None]


@dataclass(frozen=True)
class ByteDifference:
    """Where two files first differ: byte offset, 1-based line number and that line on each side."""

    offset: int
    line: int
    expected_line: str
    actual_line: str
    expected_size: int
    actual_size: int

    def explain(self) -> str:
        return (
            f"byte {self.offset} (line {self.line}; sizes {self.expected_size} vs {self.actual_size}): "
            f"oracle {self.expected_line!r} vs in-tree {self.actual_line!r}"
        )


def first_byte_difference(expected: bytes, actual: bytes) -> ByteDifference | None:
    """None if the bytes are equal, else where they first differ."""
    if expected == actual:
        return None
    offset = next(
        (i for i, (e, a) in enumerate(zip(expected, actual, strict=False)) if e != a), min(len(expected), len(actual))
    )
    line_start = expected.rfind(b"\n", 0, offset) + 1  # the same on both sides: equal up to offset

    def line_at(data: bytes) -> str:
        end = data.find(b"\n", line_start)
        return data[line_start : end if end >= 0 else len(data)].decode("utf-8", errors="replace")

    return ByteDifference(
        offset=offset,
        line=expected.count(b"\n", 0, line_start) + 1,
        expected_line=line_at(expected),
        actual_line=line_at(actual),
        expected_size=len(expected),
        actual_size=len(actual),
    )


def check_option_set(options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` as a plain dict of writer word options; anything else is an error."""
    if not isinstance(options, Mapping):
        raise ValueError(f"writer options: expected a mapping of {sorted(WORD_OPTIONS)}, got {options!r}")
    unknown = sorted(set(options) - WORD_OPTIONS)
    if unknown:
        raise ValueError(f"writer options: unknown keys {unknown} (known: {', '.join(sorted(WORD_OPTIONS))})")
    return dict(options)


def write_intree(
    transcript: Mapping[str, Any], out: Path, audio_name: str, option_sets: Sequence[Mapping[str, Any]]
) -> None:
    """Every format of `transcript` by the in-tree writers, option set i into `out/i`."""
    from models.whisper.writers import get_writer

    for index, options in enumerate(option_sets):
        folder = out / str(index)
        folder.mkdir(parents=True, exist_ok=True)
        for output_format in FORMATS:
            get_writer(output_format, folder)(dict(transcript), audio_name, **options)


def write_oracle(
    transcript: Mapping[str, Any], out: Path, audio_name: str, option_sets: Sequence[Mapping[str, Any]]
) -> None:
    """Every format of `transcript` by mlx-whisper's writers (in the oracle venv, one
    interpreter for all option sets), option set i into `out/i`."""
    job = {"result": dict(transcript), "audio_name": audio_name, "options": [dict(options) for options in option_sets]}
    with OracleProcess("mlx-whisper").run("writers.py", job) as written:
        shutil.copytree(written, out, dirs_exist_ok=True)


def read_outputs(out: Path, audio_name: str) -> dict[str, bytes]:
    """The bytes of each format's file in `out` (a missing file is an error naming it)."""
    outputs = {}
    for output_format in FORMATS:
        path = (out / audio_name).with_suffix(f".{output_format}")
        if not path.is_file():
            raise OracleError(f"writers: no {output_format} output {path}")
        outputs[output_format] = path.read_bytes()
    return outputs


# A cue's timing line in vtt ("MM:SS.mmm", hours when non-zero) and srt ("HH:MM:SS,mmm").
_TIME = r"(?:(\d+):)?(\d{2}):(\d{2})[.,](\d{3})"
_CUE = re.compile(rf"^{_TIME} --> {_TIME}$", re.MULTILINE)


def cue_milliseconds(outputs: Mapping[str, Mapping[str, bytes]]) -> list[int]:
    """Every time the vtt and srt files of `outputs` (label -> format -> bytes) put on a cue's
    timing line, in milliseconds, sorted and once each: what their writer formatted."""
    found = set()
    for files in outputs.values():
        for output_format in ("vtt", "srt"):
            text = files[output_format].decode("utf-8", errors="replace")
            for match in _CUE.finditer(text):
                groups = match.groups()
                for h, m, s, ms in (groups[:4], groups[4:]):
                    found.add(((int(h or 0) * 60 + int(m)) * 60 + int(s)) * 1000 + int(ms))
    return sorted(found)


def compare_outputs(
    expected: Mapping[str, Mapping[str, bytes]], actual: Mapping[str, Mapping[str, bytes]], labels: Sequence[str]
) -> CheckResult:
    """Per option-set label and format, the oracle's bytes against the in-tree bytes."""
    differing = []
    for label in labels:
        for output_format in FORMATS:
            diff = first_byte_difference(expected[label][output_format], actual[label][output_format])
            if diff is not None:
                differing.append((label, output_format, diff))
    compared = len(labels) * len(FORMATS)
    if not differing:
        return CheckResult(
            "writers", True, f"{compared} files identical ({', '.join(FORMATS)} x {len(labels)} option sets)"
        )
    label, output_format, diff = differing[0]
    return CheckResult(
        "writers",
        False,
        f"{output_format} with options {label} differs at {diff.explain()}"
        f" ({len(differing)} of {compared} files differ)",
        details={
            "format": output_format,
            "options": label,
            "first_diff": asdict(diff),
            "differing": [f"{fmt} {opts}" for opts, fmt, _ in differing],
        },
    )


def check_writers(
    golden_transcript: Mapping[str, Any],
    intree_transcript: Mapping[str, Any],
    audio_path: str | Path,
    writer_options: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    write_expected: WriteAll = write_oracle,
    write_actual: WriteAll = write_intree,
) -> CheckResult:
    """mlx-whisper's writers on the golden transcript against the in-tree writers on the
    in-tree transcript, every format, for `writer_options`: one option set, several, or an
    empty one for all of WORD_OPTION_SETS (the default set {} among them; a profile that
    names no options gets every subtitle path judged).

    The output files are named after `audio_path` (its suffix replaced), as mlx-whisper's CLI
    names them. `write_expected` / `write_actual` replace a side (tests pass a perturbed one).
    """
    if golden_transcript is None or intree_transcript is None:
        missing = "golden" if golden_transcript is None else "in-tree"
        return CheckResult("writers", False, f"no {missing} transcript to write")
    if isinstance(writer_options, Mapping):
        option_sets = [writer_options] if writer_options else list(WORD_OPTION_SETS)
    else:
        option_sets = list(writer_options)
    option_sets = [check_option_set(options) for options in option_sets]
    if not option_sets:
        raise ValueError("writer options: expected at least one option set")
    labels = [json.dumps(options, sort_keys=True) for options in option_sets]
    audio_name = Path(audio_path).name
    expected: dict[str, dict[str, bytes]] = {}
    actual: dict[str, dict[str, bytes]] = {}
    tmp_root = cache_root() / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="writers-", dir=tmp_root) as tmp:
        oracle_out, intree_out = Path(tmp) / "oracle", Path(tmp) / "intree"
        with progress.task(f"writers: {len(option_sets)} option sets, oracle and in-tree"):
            write_expected(golden_transcript, oracle_out, audio_name, option_sets)
            write_actual(intree_transcript, intree_out, audio_name, option_sets)
        for index, label in enumerate(labels):
            expected[label] = read_outputs(oracle_out / str(index), audio_name)
            actual[label] = read_outputs(intree_out / str(index), audio_name)
    result = compare_outputs(expected, actual, labels)
    # What the oracle's writers formatted (harness/checks/exercise_whisper.py reads it: which
    # times the comparison saw written).
    result.details["oracle_cue_ms"] = cue_milliseconds(expected)
    return result


def judge_writers(context: Any) -> CheckResult:
    """The row's judge: the writers on the golden's and the free run's transcripts. One key
    order for both (the golden's JSON keeps its keys sorted, a transcript dict keeps insertion
    order), so the writers are judged on the same result."""
    from harness.checks.tokens import sorted_keys

    return check_writers(
        sorted_keys(context.golden().extra.get("transcript")),
        sorted_keys(context.intree("free").extra.get("transcript")),
        context.audio,
        dict(context.scenario.writer_options),
    )
