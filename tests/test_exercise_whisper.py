"""`streamed_transcript` proves it streamed (issue 31 part 1): a transcriber that decodes
nothing while fed and everything at finish() returns the batch transcript bit for bit, so the
comparison passes; the path it declares, a window decoded before finish(), is what fails it,
on the scenario that exists for it (long-two-windows, 33.6 s fed 1 s at a time). The mutant
itself is judged by `make mutants` (the nightly-cpu workflow)."""

from __future__ import annotations

import pytest

from harness.checks.exercise import DECODED_BEFORE_FINISH, STREAMED


@pytest.mark.parametrize(
    ("details", "walked"),
    [
        ({"chunks": [{"stream": {"windows_before_finish": 1}}]}, {DECODED_BEFORE_FINISH}),
        (
            {"chunks": [{"stream": {"windows_before_finish": 0}}, {"stream": {"windows_before_finish": 2}}]},
            {DECODED_BEFORE_FINISH},
        ),
        ({"chunks": [{"stream": {"windows_before_finish": 0}}]}, set()),
        ({"stream": {"windows_before_finish": 0}}, set()),  # one chunk size: its details alone
        ({}, set()),
    ],
)
def test_decoded_before_finish_is_read_from_the_streams_own_runs(details: dict, walked: set) -> None:
    assert STREAMED.walked(None, {}, details) == walked


def test_a_stream_that_walked_nothing_is_an_error_on_the_scenario_that_exists_for_it() -> None:
    """What the session does with the stream-at-finish mutant's result (make mutants judges the
    mutant itself on long-two-windows: ~5 min here, so not in make test): the comparison with
    the batch run passed, no window was decoded before finish(), and long-two-windows exists
    for that path, so the check is an ERROR; a scenario that claims nothing only counts it."""
    from harness.checks.compare import CheckResult
    from harness.checks.exercise import walked_paths
    from harness.errors import NothingComparedError
    from harness.session import ParitySession

    profile = ParitySession().profile("whisper-tiny-en")
    passed = CheckResult("streamed_transcript", True, "1.0 s chunks: bit-identical (0 windows decoded before finish)")
    passed.details = {"chunks": [{"chunk_s": 1.0, "stream": {"windows_before_finish": 0, "restarts": 0}}]}
    with pytest.raises(NothingComparedError, match=r"long-two-windows exists to walk streamed_transcript's"):
        walked_paths(profile, profile.scenario("long-two-windows"), "streamed_transcript", STREAMED, None, passed)
    assert walked_paths(profile, profile.scenario("fox-greedy"), "streamed_transcript", STREAMED, None, passed) == []
