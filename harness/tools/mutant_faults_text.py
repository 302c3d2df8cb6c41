"""The text faults of `make mutants` (issue 31: four of the outside audit's misses): the streaming
detokenizer and mlx-lm's server split as restated in-tree (models/universal/detokenize.py,
response.py, tool_calls.py), each patched in process and judged on the scenario that exists to
walk its path (profiles/minicpm5-2b-mini.yaml)."""

from __future__ import annotations

import contextlib
from typing import Any

from harness.tools.mutant_faults import Mutant, _setattr


def finalize_drops_flush() -> contextlib.AbstractContextManager[None]:
    """The byte-level stream's finalize() forgets what add() held back (an incomplete UTF-8
    character flushed as U+FFFD): only a stream that ends on held text shows it."""
    from models.universal.detokenize import ByteLevelStream

    def finalize(self: Any) -> None:
        self.pending = ""

    return _setattr(ByteLevelStream, "finalize", finalize)


def no_think_start_from_normal() -> contextlib.AbstractContextManager[None]:
    """The response split never re-enters reasoning: the normal -> reasoning edge (a think
    start marker after the think block closed) is left out of the state machine."""
    from models.universal.response import ResponseBuilder

    init = ResponseBuilder.__init__

    def without_edge(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.edges["normal"] = [(m, dst) for m, dst in self.edges.get("normal", []) if dst != "reasoning"]

    return _setattr(ResponseBuilder, "__init__", without_edge)


def marker_piece_text_to_new_state() -> contextlib.AbstractContextManager[None]:
    """The splitter files the text that shares a piece with a marker, before it, under the state
    the marker enters (a boundary mis-split): invisible while every marker is a piece of its own."""
    from models.universal.response import Splitter

    split = Splitter.split

    def missplit(self: Any, text: str) -> list[tuple[str, str]]:
        segments = split(self, text)
        if len(segments) > 1 and segments[0][1]:
            (_, before), (state, after) = segments[0], segments[1]
            segments = [(segments[0][0], ""), (state, before + after), *segments[2:]]
        return segments

    return _setattr(Splitter, "split", missplit)


def integral_number_kept_float() -> contextlib.AbstractContextManager[None]:
    """The tool parser keeps an integral number-typed value a float (40.0 stays 40.0; mlx-lm's
    parser makes it 40)."""
    from models.universal import tool_calls

    readers = tuple((names, float if names[0] == "number" else reader) for names, reader in tool_calls._READERS)
    return _setattr(tool_calls, "_READERS", readers)


TEXT_MUTANTS = [
    Mutant(
        "finalize-drops-flush",
        "the detokenizer's finalize() drops the incomplete character add() held back",
        "minicpm5-2b-mini",
        "multibyte-turns",
        patch=finalize_drops_flush,
    ),
    Mutant(
        "no-reasoning-reentry",
        "the response split has no normal -> reasoning edge (a think start after the think block closed)",
        "minicpm5-2b-mini",
        "response-split",
        patch=no_think_start_from_normal,
    ),
    Mutant(
        "marker-piece-missplit",
        "text sharing a piece with a marker, before it, is filed under the marker's new state",
        "minicpm5-2b-mini",
        "response-split",
        patch=marker_piece_text_to_new_state,
    ),
    Mutant(
        "integral-number-float",
        "a number-typed tool argument with an integral value is kept a float (40.0, not 40)",
        "minicpm5-2b-mini",
        "response-split",
        patch=integral_number_kept_float,
    ),
]
