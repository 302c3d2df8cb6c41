"""A speech scenario's options checked at the edge: mlx-whisper's transcribe options that count
something, and the writers check's word options (harness/profile/load.py calls them)."""

from __future__ import annotations

from typing import Any

from harness.errors import ProfileError

COUNT_OPTIONS = ("beam_size", "best_of", "sample_len")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_transcribe_options(options: dict[str, Any], where: str) -> None:
    for key in COUNT_OPTIONS:
        value = options.get(key)
        if value is not None and (not is_int(value) or value < 1):
            raise ProfileError(f"{where}.{key}: expected an integer >= 1, got {value!r}")
    patience = options.get("patience")
    if patience is not None and (isinstance(patience, bool) or not isinstance(patience, int | float) or patience <= 0):
        raise ProfileError(f"{where}.patience: expected a number > 0, got {patience!r}")


def check_writer_options(options: dict[str, Any], where: str) -> None:
    from harness.checks.writers import WORD_OPTIONS

    unknown = sorted(set(options) - WORD_OPTIONS)
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(WORD_OPTIONS)}")
    for key, value in options.items():
        if key == "highlight_words":
            if not isinstance(value, bool):
                raise ProfileError(f"{where}.{key}: expected a boolean, got {value!r}")
        elif value is not None and (not is_int(value) or value < 1):
            raise ProfileError(f"{where}.{key}: expected an integer >= 1, got {value!r}")
