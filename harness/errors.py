"""One exception family, so every bad input ends in one clear message and a non-zero exit."""

import difflib
from collections.abc import Iterable, Mapping
from typing import TypeVar

T = TypeVar("T")


class HarnessError(Exception):
    """Base of every error the harness reports to a user (no traceback needed)."""


class UsageError(HarnessError):
    """An argument a verb was given cannot be acted on (the CLI exits 2 with the verb's usage)."""


class ProfileError(HarnessError):
    """A profile file is malformed: names the file, the key and what was expected."""


class UnknownModelError(HarnessError):
    """A model name has no profile."""


class ArtifactError(HarnessError):
    """A pinned artifact cannot be resolved or does not match its pins."""


class OracleError(HarnessError):
    """The oracle venv cannot be built or its generator failed."""


class OracleVersionError(OracleError):
    """The oracle venv's mlx (or backend) differs from the project's: bits are not comparable."""


class GoldenError(HarnessError):
    """A golden is missing, corrupted or unreadable."""


class StaleGoldenError(GoldenError):
    """A golden's provenance no longer matches: regenerate it explicitly with `make goldens`."""


class RecordError(HarnessError):
    """A record has the wrong tensors (shape, dtype, missing keys)."""


class InTreeLoadError(HarnessError):
    """The in-tree implementation refused the artifact (unknown/missing tensors, bad config)."""


class NonDeterministicError(HarnessError):
    """An implementation gave different bits for the same inputs: its comparison is void."""


class NothingComparedError(HarnessError):
    """A check found nothing to compare (no rows, no tokens, no transcript): never a pass."""


class InTreeRunError(HarnessError):
    """The in-tree run did not do what its check asked of it (e.g. a compiled decode that fell back)."""


def table_row(
    table: Mapping[str, T],
    name: str,
    what: str,
    how_to_add: str,
    error: type[HarnessError] = HarnessError,
) -> T:
    """`table[name]`, or `error` naming the unknown `what`, the closest known names and how one is added."""
    try:
        return table[name]
    except KeyError:
        raise error(f"{unknown(name, table, what)} ({how_to_add})") from None


def unknown(name: str, known: Iterable[str], what: str, known_as: str = "expected one of") -> str:
    """'unknown model 'smolm2': did you mean 'smollm2-135m'? known models: …' (difflib's close matches)."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
    return f"unknown {what} {name!r}: {hint}{known_as}: {', '.join(known) or '(none)'}"
