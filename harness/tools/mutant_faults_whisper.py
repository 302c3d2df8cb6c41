"""Whisper faults of `make mutants` that only a scenario built for their path can see (issue 31
part 1, the audit's word-timing and writer faults): each patches the in-tree code at run time,
as harness/tools/mutant_faults.py's do, and WHISPER_MUTANTS names the scenario that kills it
(profiles/whisper-tiny-en.yaml, fox-pause-words; the paths: harness/checks/exercise_whisper.py), and the
beam-candidate fault that only the candidates comparison sees (issue 53 part 4, fox-beam5)."""

from __future__ import annotations

import contextlib
from typing import Any

from harness.tools.mutant_faults import Mutant, _setattr


def word_pause_at_3x() -> contextlib.AbstractContextManager[None]:
    """models/whisper/timing.py's pause rule (mlx-whisper's add_word_timestamps): a segment's
    first word is cut to max_duration (twice the median word duration) when it is too long and
    ends more than 3x, not 4x, the median after the last speech (timing.PAUSE_MEDIANS, read at
    each call). Only a too-long first word ending 3x to 4x the median after the last speech
    sees it (fox-words' and long-words' first words do not: the audit's fault)."""
    import models.whisper.timing as timing

    return _setattr(timing, "PAUSE_MEDIANS", 3)  # the fault: 4 in-tree


def timestamp_ms_truncated() -> contextlib.AbstractContextManager[None]:
    """models/whisper/writers.py's format_timestamp truncates to whole milliseconds
    (int(seconds * 1000)) instead of rounding them (round(seconds * 1000), as mlx-whisper): the
    same for all but 18 of the 3,000 two-decimal times below 30 s (4.02 s: 4019.9999999999995 ms,
    00:04.019 instead of 00:04.020); none of fox-words' ten times is one of them."""
    import models.whisper.writers as writers

    def truncating(seconds: float, always_include_hours: bool = False, decimal_marker: str = ".") -> str:
        if not seconds >= 0:
            raise ValueError(f"timestamp: expected a non-negative number of seconds, got {seconds!r}")
        total_ms = int(seconds * 1000.0)  # the fault: round() in-tree
        hours, rest = divmod(total_ms, 3_600_000)
        minutes, rest = divmod(rest, 60_000)
        whole_seconds, milliseconds = divmod(rest, 1_000)
        hours_marker = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
        return f"{hours_marker}{minutes:02d}:{whole_seconds:02d}{decimal_marker}{milliseconds:03d}"

    return _setattr(writers, "format_timestamp", truncating)


def beam_finished_reversed() -> contextlib.AbstractContextManager[None]:
    """models/whisper/token_decoders.py's BeamSearchDecoder.finalize hands the ranker each
    audio's finished sequences last-finished first. The ranker takes the best score wherever it
    stands, so the chosen sequence, its tokens and its text are the same (unless two candidates
    tie): only the candidates, in the order the search finished them, show it (issue 53 part 4)."""
    import models.whisper.token_decoders as token_decoders

    original = token_decoders.BeamSearchDecoder.finalize

    def finalize(self: Any, tokens: list, sum_logprobs: list) -> tuple[list, list]:
        sequences, sums = original(self, tokens, sum_logprobs)
        return [group[::-1] for group in sequences], [group[::-1] for group in sums]

    return _setattr(token_decoders.BeamSearchDecoder, "finalize", finalize)


WHISPER_MUTANTS: list[Mutant] = [
    Mutant(
        "word-pause-x3",
        "a segment's first word is cut after a pause over 3x the median word duration, not 4x",
        "whisper-tiny-en",
        "fox-pause-words",
        patch=word_pause_at_3x,
        on={"whisper-base": "fox-pause-words"},
    ),
    Mutant(
        "timestamp-ms-truncated",
        "subtitle timestamps truncated to whole milliseconds instead of rounded",
        "whisper-tiny-en",
        "fox-pause-words",
        patch=timestamp_ms_truncated,
        on={"whisper-base": "fox-pause-words"},
    ),
    Mutant(
        "beam-finished-reversed",
        "beam search hands the ranker its finished sequences last-finished first",
        "whisper-tiny-en",
        "fox-beam5",
        patch=beam_finished_reversed,
    ),
]
