"""The `response` check: the in-tree split of a token stream into reasoning, content and tool
calls (models/universal/response.py) against mlx-lm's server, streamed chunk by chunk and whole.

Sequences: `generated` (the teacher-forced run's tokens, which are the golden's) and each
forced text of the scenario. A forced text must have the same ids on both sides (else that is
the failure, named); then the initial state, the tokens the stream consumed, every chunk
(finish reason, content, reasoning, tool calls with their arguments' JSON text) and the whole
message. A mismatch names the sequence, the chunk index and both sides' fields.
"""

from __future__ import annotations

from typing import Any

from harness.checks.compare import CheckResult
from harness.errors import NothingComparedError
from harness.records import ScenarioRecord


def _fields(chunk: Any) -> Any:
    if not isinstance(chunk, dict):
        return chunk
    body = chunk.get("delta", chunk.get("message", {}))
    return {"finish_reason": chunk.get("finish_reason"), **{k: v for k, v in body.items() if k != "role"}} | (
        {"usage": chunk["usage"]} if "usage" in chunk else {}
    )


def _sequence(name: str, golden: dict[str, Any], actual: dict[str, Any]) -> str | None:
    """What first differs in one sequence, or None."""
    if "ids" in golden and golden["ids"] != actual.get("ids"):
        return (
            f"forced {name!r}: the text {golden['text']!r} encodes to {actual.get('ids')} in-tree, "
            f"{golden['ids']} in the oracle (the sequences are not the same tokens)"
        )
    label = "generated tokens" if "ids" not in golden else f"forced {name!r}"
    for key in ("initial_state", "tokens"):
        if golden[key] != actual.get(key):
            return f"{label}: {key} differs: oracle {golden[key]!r} vs in-tree {actual.get(key)!r}"
    stream, mine = golden["stream"], actual.get("stream", [])
    for i in range(max(len(stream), len(mine))):
        expected = _fields(stream[i]) if i < len(stream) else "(no chunk)"
        got = _fields(mine[i]) if i < len(mine) else "(no chunk)"
        if expected != got:
            return f"{label}: streamed chunk {i} of {len(stream)} differs: oracle {expected!r} vs in-tree {got!r}"
    if _fields(golden["whole"]) != _fields(actual.get("whole")):
        return (
            f"{label}: non-streaming message differs: oracle {_fields(golden['whole'])!r} "
            f"vs in-tree {_fields(actual.get('whole'))!r}"
        )
    return None


def check_response(golden: ScenarioRecord, actual: ScenarioRecord) -> CheckResult:
    expected = golden.extra.get("server_response")
    if not expected:
        raise NothingComparedError("response: nothing to compare: the golden has no server response")
    mine = actual.extra.get("server_response") or {}
    pairs = [("generated", expected["generated"], mine.get("generated") or {})]
    theirs_ids = [f["id"] for f in expected["forced"]]
    mine_ids = [f["id"] for f in mine.get("forced", [])]
    if theirs_ids != mine_ids:
        problem = f"response: forced sequences {mine_ids} in-tree, {theirs_ids} in the oracle"
        return CheckResult("response", False, problem)
    pairs += [(f["id"], f, m) for f, m in zip(expected["forced"], mine["forced"], strict=True)]
    for name, g, a in pairs:
        problem = _sequence(name, g, a)
        if problem is not None:
            return CheckResult("response", False, f"response: {problem}", details={"sequence": name})
    chunks = sum(len(g["stream"]) for _, g, _ in pairs)
    return CheckResult(
        "response",
        True,
        f"{len(pairs)} sequences ({', '.join(n for n, _, _ in pairs)}): {chunks} streamed chunks and "
        "every non-streaming message identical to mlx-lm's server",
    )
