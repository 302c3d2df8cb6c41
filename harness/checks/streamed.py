"""The `streamed_transcript` gate: the streaming transcriber against the batch run, in-tree.

The batch run is the scenario's free in-tree record (itself gated against mlx-whisper). The
same scenario is fed to `models.whisper.stream.StreamingTranscriber` in chunks of each chunk
size (1 s, 7 s and 30 s unless the scenario's `stream_chunks` says otherwise), and each streamed
record must equal the batch record bit for bit: the windows (every decode call: seek, frames,
temperature, tokens, decisions), every per-step logits row, the tokens, the transcript (text,
segments, timestamps, log-probs), the log-Mel and every window's encoder output. A failure names
the chunk size, the window (decode call and its seek) or step, and what differs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from harness.checks.compare import CheckResult, compare_steps, first_json_difference, raw_bits
from harness.errors import NothingComparedError
from harness.records import ScenarioRecord

CHECK = "streamed_transcript"
DEFAULT_CHUNKS = (1.0, 7.0, 30.0)  # seconds of samples per feed


def compare_streamed(batch: ScenarioRecord, streamed: ScenarioRecord, chunk: float) -> CheckResult:
    """One chunk size: the streamed record against the batch record, first difference named."""
    label = f"{chunk:g} s chunks"

    def fail(summary: str, step: int | None = None, **details: Any) -> CheckResult:
        return CheckResult(
            CHECK, False, f"{label}: {summary}", first_bad_step=step, details={"chunk_s": chunk} | details
        )

    calls, mine = batch.extra.get("decode_calls") or [], streamed.extra.get("decode_calls") or []
    if not calls:
        raise NothingComparedError(f"{CHECK}: nothing to compare: the batch run made no decode call")
    if len(mine) != len(calls):
        seeks = [c["seek"] for c in calls]
        missing = [c["seek"] for c in calls[len(mine) :]] or [c["seek"] for c in mine[len(calls) :]]
        return fail(
            f"the batch run made {len(calls)} decode calls (windows at seek {seeks}), the stream {len(mine)}: "
            f"{'missing' if len(mine) < len(calls) else 'extra'} window(s) at seek {missing}",
            expected_calls=len(calls),
            streamed_calls=len(mine),
        )
    for i, (c, m) in enumerate(zip(calls, mine, strict=True)):
        found = first_json_difference(c, m)
        if found is not None:
            path, e, a = found
            return fail(
                f"decode call {i} (window at seek {c['seek']}) differs at {path.lstrip('.')}: "
                f"batch {e!r} vs streamed {a!r}"
            )
    if batch.logits.shape != streamed.logits.shape:
        return fail(f"logits {batch.logits.shape} in the batch run, {streamed.logits.shape} streamed")
    steps = compare_steps(CHECK, batch, streamed, range(len(batch.tokens)))
    if not steps.passed:
        return fail(steps.summary, steps.first_bad_step, **steps.details)
    if streamed.tokens != batch.tokens:
        at = next(i for i, (a, b) in enumerate(zip(batch.tokens, streamed.tokens, strict=False)) if a != b)
        return fail(f"token {at}: batch {batch.tokens[at]} vs streamed {streamed.tokens[at]}", at)
    found = first_json_difference(batch.extra.get("transcript"), streamed.extra.get("transcript"))
    if found is not None:
        path, e, a = found
        return fail(f"transcript differs at {path.lstrip('.')}: batch {e!r} vs streamed {a!r}")
    for name in ("mel", "encoder"):
        e, a = batch.arrays[name], streamed.arrays[name]
        if e.shape != a.shape or raw_bits(e).tobytes() != raw_bits(a).tobytes():
            where = "shape" if e.shape != a.shape else f"first differing index {_first_difference(e, a)}"
            return fail(f"{name} {e.shape} batch vs {a.shape} streamed: {where}")
    stream = streamed.extra.get("stream", {})
    return CheckResult(
        CHECK,
        True,
        f"{label}: {len(calls)} windows, {len(batch.tokens)} logits rows, tokens, transcript, mel and encoder "
        f"bit-identical ({stream.get('windows_before_finish', '?')} windows decoded before finish, "
        f"{stream.get('restarts', '?')} restarts)",
        steps_compared=len(batch.tokens),
        details={"chunk_s": chunk, "stream": stream},
    )


def _first_difference(expected: np.ndarray, actual: np.ndarray) -> tuple[int, ...]:
    index = np.argwhere(raw_bits(expected) != raw_bits(actual))[0]
    return tuple(int(i) for i in index)


def check_streamed(
    batch: ScenarioRecord, stream_run: Callable[[float], ScenarioRecord], chunks: Sequence[float] | None
) -> CheckResult:
    """Every chunk size in turn (`stream_run(seconds)` is the streamed record); the first failing
    one is the verdict, else one result summing them up."""
    chunks = tuple(chunks) if chunks else DEFAULT_CHUNKS
    passed = []
    for chunk in chunks:
        result = compare_streamed(batch, stream_run(chunk), chunk)
        if not result.passed:
            return result
        passed.append(result)
    return CheckResult(
        CHECK,
        True,
        "; ".join(r.summary for r in passed),
        steps_compared=sum(r.steps_compared for r in passed),
        details={"chunks": [r.details for r in passed]},
    )


def judge_streamed(context: Any) -> CheckResult:
    """The row's judge: the in-tree stream against the in-tree batch run (which its own checks
    gate against the oracle), at the scenario's chunk sizes."""
    return check_streamed(context.intree("free"), context.streamed, context.scenario.stream_chunks)
