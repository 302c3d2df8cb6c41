"""`streamed_transcript` proves it streamed (issue 31 part 1): a transcriber that decodes
nothing while fed and everything at finish() returns the batch transcript bit for bit, so the
comparison passes; the path it declares, a window decoded before finish(), is what fails it,
on the scenario that exists for it (long-two-windows, 33.6 s fed 1 s at a time)."""

from __future__ import annotations

import dataclasses

import pytest

from harness.checks.exercise import DECODED_BEFORE_FINISH, STREAMED

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("whisper-tiny-en")]


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


def test_a_stream_that_decodes_only_at_finish_is_an_error_where_a_window_could_stream() -> None:
    from harness.tools.mutant_list import MUTANTS
    from harness.tools.mutants import judge

    mutant = next(m for m in MUTANTS if m.name == "stream-at-finish")
    judged = judge(dataclasses.replace(mutant, scenario="long-two-windows"))
    assert judged["outcomes"]["streamed_transcript"] == "error", judged["summaries"]
    assert (
        "exists to walk streamed_transcript's ['decoded before finish']" in judged["summaries"]["streamed_transcript"]
    )
    assert all(o == "passed" for c, o in judged["outcomes"].items() if c != "streamed_transcript"), judged["outcomes"]
