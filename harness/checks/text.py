"""The `detokenize` judge: streamed text, piece by piece, and the full decode.

Both records carry `stream_text`, one entry per segment (the run, a turn, a batch row):
`pieces`, the text a streaming detokenizer hands out for each token as mlx-lm's
`stream_generate` drives it, and `decoded`, the tokenizer's decode of the tokens it was fed.
The in-tree side is its teacher-forced run, fed the golden's ids, so only the detokenizer and
the decode are judged, never the choice of tokens.
"""

from __future__ import annotations

from typing import Any

from harness.checks.compare import CheckResult
from harness.errors import NothingComparedError
from harness.records import ScenarioRecord


def _segments(record: ScenarioRecord, side: str) -> list[dict[str, Any]]:
    text = record.extra.get("stream_text")
    if not isinstance(text, list) or not all(isinstance(s, dict) and "pieces" in s and "decoded" in s for s in text):
        raise NothingComparedError(
            f"detokenize: nothing to compare: the {side} record has no stream_text "
            f"(expected a list of {{pieces, decoded}} per segment, got {text!r:.80})"
        )
    return text


def stream_stats(segments: list[dict[str, Any]]) -> dict[str, int]:
    """How much the streamed text exercises: pieces, empty pieces (a token held back, e.g. part
    of a multi-byte character) and characters of more than one UTF-8 byte."""
    pieces = [p for s in segments for p in s["pieces"]]
    return {
        "pieces": len(pieces),
        "held_back": sum(1 for p in pieces[:-1] if p == ""),
        "multibyte_chars": sum(1 for p in pieces for ch in p if len(ch.encode("utf-8")) > 1),
    }


def compare_stream_text(golden: ScenarioRecord, actual: ScenarioRecord) -> CheckResult:
    expected, got = _segments(golden, "golden"), _segments(actual, "in-tree")
    if actual.tokens != golden.tokens:
        # The teacher-forced record's tokens are the model's picks (fed the golden's): a logits
        # difference, not the detokenizer's; what it streams would be other tokens' pieces.
        at = next((i for i, (g, a) in enumerate(zip(golden.tokens, actual.tokens, strict=False)) if g != a), None)
        where = (
            f"step {at}: oracle {golden.tokens[at]}, in-tree {actual.tokens[at]}"
            if at is not None
            else f"{len(golden.tokens)} tokens in the golden, {len(actual.tokens)} in-tree"
        )
        return CheckResult(
            "detokenize",
            False,
            f"the in-tree teacher-forced run picked other tokens than the oracle ({where}): a logits "
            "difference (teacher_forced_logits says where), so the streamed pieces were not compared",
            first_bad_step=at,
        )
    if len(expected) != len(got):
        return CheckResult("detokenize", False, f"{len(expected)} segments streamed by the oracle, {len(got)} in-tree")
    if not any(s["pieces"] for s in expected):
        raise NothingComparedError("detokenize: nothing to compare: the golden streamed no pieces")
    offsets = [seg.row_offset for seg in golden.segments()]
    for n, (e, a) in enumerate(zip(expected, got, strict=True)):
        base = offsets[n] if len(offsets) == len(expected) else 0
        for i in range(max(len(e["pieces"]), len(a["pieces"]))):
            pe = e["pieces"][i] if i < len(e["pieces"]) else None
            pa = a["pieces"][i] if i < len(a["pieces"]) else None
            if pe != pa:
                row = base + i
                token = golden.tokens[row] if row < len(golden.tokens) else None
                where = golden.describe_row(row) if len(expected) > 1 else f"token {i}"
                return CheckResult(
                    "detokenize",
                    False,
                    f"streamed piece differs at {where} (token id {token}): oracle {pe!r} vs in-tree {pa!r}",
                    first_bad_step=row,
                    details={"segment": n, "token_index": i, "token_id": token, "oracle": pe, "intree": pa},
                )
        if e["decoded"] != a["decoded"]:
            return CheckResult(
                "detokenize",
                False,
                f"full decode of segment {n} differs: oracle {e['decoded']!r} vs in-tree {a['decoded']!r}",
                details={"segment": n, "oracle": e["decoded"], "intree": a["decoded"]},
            )
    stats = stream_stats(expected)
    joined = ["".join(s["pieces"]) == s["decoded"] for s in expected]
    trimmed = sum(1 for s in expected if s["decoded"] == " " + "".join(s["pieces"]))
    relation = "joined pieces equal the full decode"
    if not all(joined):
        relation += f" in {sum(joined)} of {len(joined)} segments ({trimmed} lose the decode's leading space"
        relation += ", as mlx-lm's stream does; both sides alike)"
    return CheckResult(
        "detokenize",
        True,
        f"{stats['pieces']} streamed pieces and {len(expected)} full decode(s) identical; {stats['held_back']} "
        f"tokens held back, {stats['multibyte_chars']} multi-byte characters; {relation}",
        steps_compared=stats["pieces"],
        details=stats | {"joined_equals_decode": joined},
    )
