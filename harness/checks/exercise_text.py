"""The paths of the text checks, `detokenize` and `response` (issue 31 part 1): what a scenario
must make the reference do for the check to prove something, read from the oracle's record.

- detokenize: a stream whose last piece is text only `finalize()` releases. mlx-lm's streaming
  detokenizers never release a decoded text that ends in U+FFFD from `add_token` (the BPE one
  holds an incomplete UTF-8 character back until it completes; the SentencePiece one holds
  everything after the last word start), so a last piece (read after `finalize()`) that ends in
  U+FFFD was flushed by `finalize()`. A finalize that drops what it holds passes every stream
  whose last piece `add_token` released.
- response: mlx-lm's server text state machine, recorded by the oracle as it ran (`moves`,
  oracles/common/lm_response.py: each piece of text on which it changed state, the text it held
  from earlier pieces, the segments it returned): each transition the profile's scenarios make
  possible (think markers with `enable_thinking`, call markers with `tools`), a marker that
  arrives over several pieces, a marker that shares its piece with text, and, for a tool with a
  number-typed parameter, an integral and a non-integral number in the server's parsed calls.
"""

from __future__ import annotations

import json
from typing import Any

from harness.checks.exercise import Exercise
from harness.records import ScenarioRecord

FINALIZE_FLUSH = "finalize() flushes held text"


def _finalize_flush(golden: ScenarioRecord, spec: dict[str, Any], details: dict[str, Any]) -> set[str]:
    for segment in golden.extra.get("stream_text") or []:
        pieces = segment.get("pieces") or []
        if pieces and pieces[-1].endswith("\ufffd"):
            return {FINALIZE_FLUSH}
    return set()


DETOKENIZE = Exercise(
    "a stream's last piece is text that only finalize() releases (it ends in U+FFFD: an incomplete "
    "UTF-8 character add_token holds back)",
    lambda profile: [FINALIZE_FLUSH],
    _finalize_flush,
)

CONTENT = "content"
OVER_PIECES = "a marker over several pieces"
WITH_TEXT = "a marker sharing its piece with text"
INTEGRAL, FRACTIONAL = "an integral number argument", "a non-integral number argument"


def _edge(a: str, b: str) -> str:
    return f"{a} -> {b}"


def _number_params(tools: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Per function, its parameters typed `number` (alone or among other types)."""
    out: dict[str, set[str]] = {}
    for tool in tools or []:
        function = tool.get("function") or {}
        props = (function.get("parameters") or {}).get("properties") or {}
        for name, schema in props.items():
            kind = schema.get("type") if isinstance(schema, dict) else None
            if kind == "number" or (isinstance(kind, list) and "number" in kind):
                out.setdefault(function.get("name", ""), set()).add(name)
    return out


def _declared_response(profile: Any) -> list[str]:
    """What the profile's response scenarios make possible: content always; the think
    transitions where the template is asked about thinking; the call transitions where tools are
    offered (from reasoning too when both); marker boundaries where there is a marker; both
    kinds of number where a tool has a number-typed parameter."""
    paths = [CONTENT]
    scenarios = [s for s in profile.scenarios if "response" in profile.checks(s)]
    thinking = any("enable_thinking" in s.template_kwargs for s in scenarios)
    tools = [t for s in scenarios for t in s.template_kwargs.get("tools") or []]
    if thinking:
        paths += [_edge("normal", "reasoning"), _edge("reasoning", "normal")]
    if tools:
        paths += [_edge("normal", "tool"), _edge("tool", "normal")] + ([_edge("reasoning", "tool")] if thinking else [])
    if thinking or tools:
        paths += [OVER_PIECES, WITH_TEXT]
    if _number_params(tools):
        paths += [INTEGRAL, FRACTIONAL]
    return paths


def _moves_walked(moves: list[dict[str, Any]]) -> set[str]:
    out = set()
    for move in moves:
        states = [state for state, _ in move["segments"]]
        out |= {_edge(a, b) for a, b in zip(states, states[1:], strict=False) if a is not None and b is not None}
        held, before = move["held"], move["segments"][0][1]
        if held and len(before) < len(held):  # the first marker began in the text held back
            out.add(OVER_PIECES)
        if len(before) > len(held) or any(text for _, text in move["segments"][1:]):
            out.add(WITH_TEXT)  # text of this piece before the marker, or after it
    return out


def _numbers_walked(whole: dict[str, Any], numbers: dict[str, set[str]]) -> set[str]:
    out = set()
    for call in (whole.get("message") or {}).get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except json.JSONDecodeError:
            continue
        for name in numbers.get(function.get("name", ""), set()):
            value = arguments.get(name) if isinstance(arguments, dict) else None
            if isinstance(value, int | float) and not isinstance(value, bool):
                out.add(INTEGRAL if float(value).is_integer() else FRACTIONAL)
    return out


def _response_walked(golden: ScenarioRecord, spec: dict[str, Any], details: dict[str, Any]) -> set[str]:
    record = golden.extra.get("server_response") or {}
    numbers = _number_params((spec.get("template_kwargs") or {}).get("tools") or [])
    out: set[str] = set()
    for sequence in [record.get("generated") or {}, *(record.get("forced") or [])]:
        out |= _moves_walked(sequence.get("moves") or [])
        out |= _numbers_walked(sequence.get("whole") or {}, numbers)
        if any((_body(c).get("content")) for c in sequence.get("stream") or []):
            out.add(CONTENT)
    return out


def _body(chunk: Any) -> dict[str, Any]:
    return (chunk.get("delta") or chunk.get("message") or {}) if isinstance(chunk, dict) else {}


RESPONSE = Exercise(
    "mlx-lm's server state machine takes each transition the scenarios make possible (think and call markers), "
    "a marker arrives over several pieces and one shares its piece with text, and a tool's number-typed "
    "parameter is parsed both integral and not",
    _declared_response,
    _response_walked,
)
