"""The oracle-release bisection's search and its arguments (the real run over mlx-lm releases is
recorded in docs/history.md: it builds one venv per release looked at)."""

from __future__ import annotations

import pytest

from harness.errors import UsageError
from harness.history.oracle_bisect import between, first_change, parse_range


def _search(bits: list[str | None]) -> tuple[int | None, list[int]]:
    asked: list[int] = []

    def same(i: int) -> bool | None:
        asked.append(i)
        return None if bits[i] is None else bits[i] == bits[0]

    return first_change([str(i) for i in range(len(bits))], same), asked


@pytest.mark.parametrize(
    ("bits", "expected"),
    [
        (["a", "a", "a"], None),  # no release changed anything
        (["a", "b", "b"], 1),
        (["a", "a", "b"], 2),
        (["a", "a", "a", "a", "b", "b", "b", "b", "b"], 4),
        (["a", None, "b"], 2),  # an uninstallable release between: the next judgeable one
        (["a", "a", None], None),  # the last cannot be judged: the one before it is the end
        (["a", "a", "a", None, "b"], 4),
    ],
)
def test_the_search_finds_the_first_release_whose_bits_differ(bits: list[str | None], expected) -> None:
    found, asked = _search(bits)
    assert found == expected
    assert len(set(asked)) <= len(bits)  # each release built at most once by the caller's cache


def test_a_long_range_is_searched_in_log_steps() -> None:
    bits = ["a"] * 40 + ["b"] * 24
    found, asked = _search(bits)
    assert found == 40 and len(set(asked)) <= 8


def test_ranges_are_parsed_and_checked_against_the_releases() -> None:
    assert parse_range("mlx-lm=0.32.0..0.32.2") == ("mlx-lm", "0.32.0", "0.32.2")
    released = ["0.32.2", "0.32.1", "0.32.0", "0.31.3", "0.30.7"]
    assert between(released, "0.31.3", "0.32.2") == ["0.31.3", "0.32.0", "0.32.1", "0.32.2"]
    with pytest.raises(UsageError, match="expected DIST=FIRST..LAST"):
        parse_range("mlx-lm 0.32")
    with pytest.raises(UsageError, match="0.32.9 is not a released version"):
        between(released, "0.32.0", "0.32.9")
