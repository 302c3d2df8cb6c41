"""The records interface, version 1 (docs/records.md): what an oracle generator's `result.json`
holds and what a record's meta is (a generator's `scenarios[id]`, a golden manifest's `record`).

`check_result` checks the result file's own keys (`records_version`, `scenarios`, `environment`);
`check_meta` walks one record's fields in the documented order and raises a RecordError naming
the first wrong field by its path (`decode_calls[1].n_steps`) with what was expected. Keys the
interface does not name are accepted (generators write notes such as `prefill_calls`); nested
objects may carry more keys than the documented ones.

Imports nothing of the harness but its errors: harness/records.py builds records on it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.errors import RecordError

RECORDS_VERSION = 1

# Keys of a record's `extra` whose list describes its segments, and how a row names one.
SEGMENT_KEYS = {"turns": "turn", "rows": "batch row", "decode_calls": "decode call"}
# Everything besides tokens and tensors that a generator reports and the gates judge.
EXTRA_KEYS = (*SEGMENT_KEYS, "transcript", "step_info", "finish_reason", "server_response", "stream_text")
MODES = ("free", "teacher_forced")
FINISH_REASONS = ("stop", "length")

_ARRAY_NAME = re.compile(r"[A-Za-z0-9_-]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# Checks that tie a field to fields before it, by field name: (the object, its path prefix).
Across = dict[str, Callable[[dict[str, Any], str], None]]


class _Wrong(Exception):
    """The first wrong field: its path and what was expected there (turned into a RecordError)."""

    def __init__(self, path: str, expected: str, got: str) -> None:
        super().__init__(f"{path}: expected {expected}, got {got}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({type(value).__name__})"


# -- rules: what a field is, said once for the check and its message ---------------------------


@dataclass(frozen=True)
class Rule:
    what: str  # what was expected, as the message says it
    ok: Callable[[Any], bool] | None = None  # a leaf's test
    item: Rule | None = None  # a list's items
    fields: tuple[tuple[str, Rule, bool], ...] | None = None  # an object's (name, rule, required), in order
    across: Across | None = None  # an object's checks tying a field to those before it

    def check(self, value: Any, path: str) -> None:
        if self.ok is not None and not self.ok(value):
            raise _Wrong(path, self.what, _show(value))
        if self.item is not None:
            if not isinstance(value, list):
                raise _Wrong(path, self.what, _show(value))
            for i, item in enumerate(value):
                self.item.check(item, f"{path}[{i}]")
        if self.fields is not None:
            if not isinstance(value, dict):
                raise _Wrong(path, self.what, _show(value))
            walk(value, self.fields, f"{path}.", self.across)


def walk(
    obj: dict[str, Any],
    fields: tuple[tuple[str, Rule, bool], ...],
    prefix: str = "",
    across: Across | None = None,
) -> None:
    """Each field of `obj` in order; `across[name]` (if any) right after the field `name` passed."""
    for name, rule, required in fields:
        if name in obj:
            rule.check(obj[name], prefix + name)
            if across and name in across:
                across[name](obj, prefix)
        elif required:
            raise _Wrong(prefix + name, rule.what, "nothing (the key is missing)")


def _is_int(value: Any, minimum: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _leaf(what: str, ok: Callable[[Any], bool]) -> Rule:
    return Rule(what, ok=ok)


def _list(what: str, item: Rule) -> Rule:
    return Rule(what, item=item)


def _obj(what: str, *fields: tuple[str, Rule, bool], across: Across | None = None) -> Rule:
    return Rule(what, fields=fields, across=across)


def _or_null(rule: Rule) -> Rule:
    return _leaf(f"{rule.what} or null", lambda v: v is None or _passes(rule, v))


def _passes(rule: Rule, value: Any) -> bool:
    try:
        rule.check(value, "")
    except _Wrong:
        return False
    return True


TOKEN = _leaf("an int token id", _is_int)
TOKENS = _list("a list of int token ids", TOKEN)
COUNT = _leaf("a non-negative int", _is_int)
POSITIVE = _leaf("an int >= 1", lambda v: _is_int(v, 1))
INT = _leaf("an int", lambda v: isinstance(v, int) and not isinstance(v, bool))
NUMBER = _leaf("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool))
TEXT = _leaf("a string", lambda v: isinstance(v, str))
NAME = _leaf("a non-empty string", lambda v: isinstance(v, str) and bool(v))
BOOL = _leaf("true or false", lambda v: isinstance(v, bool))
OBJECT = _leaf("a JSON object", lambda v: isinstance(v, dict))
ARRAY_NAME = _leaf(
    "a tensor name (letters, digits, _ or -; not 'logits')",
    lambda v: isinstance(v, str) and bool(_ARRAY_NAME.fullmatch(v)) and v != "logits",
)
SHA256 = _leaf(
    "64 lowercase hex digits or null", lambda v: v is None or (isinstance(v, str) and bool(_SHA256.fullmatch(v)))
)

# -- the segments: turns, batch rows, decode calls ---------------------------------------------

_PROMPT_SEGMENT = (
    ("rendered_prompt", _or_null(TEXT), True),
    ("prompt_ids", TOKENS, True),
    ("n_steps", COUNT, True),
    ("row_offset", COUNT, True),
)
TURN = _obj(
    "a turn object",
    *_PROMPT_SEGMENT,
    ("prefill_calls", COUNT, False),
    ("cache_offset_after", COUNT, False),
)
BATCH_ROW = _obj("a batch row object", *_PROMPT_SEGMENT)


def _one_list_a_member(call: dict[str, Any], prefix: str) -> None:
    if len(call["member_tokens"]) != call["batch"]:
        raise _Wrong(
            f"{prefix}member_tokens", f"one list per batch member ({call['batch']})", _show(call["member_tokens"])
        )


# what a decode at one temperature scored (openai-whisper's DecodingResult), in a call and a segment
_DECODE_QUALITY = (
    ("temperature", NUMBER, True),
    ("avg_logprob", NUMBER, True),
    ("compression_ratio", NUMBER, True),
    ("no_speech_prob", NUMBER, True),
)

# beam search's finished sequences of the call's audio, in the order they finished
CANDIDATE = _obj("a candidate object", ("tokens", TOKENS, True), ("sum_logprob", NUMBER, True))

DECODE_CALL = _obj(
    "a decode call object",
    ("seek", COUNT, True),
    ("segment_frames", COUNT, True),
    ("attempt", COUNT, True),
    ("batch", POSITIVE, True),
    ("initial_tokens", TOKENS, True),
    ("n_steps", COUNT, True),
    ("row_offset", COUNT, True),
    ("lookahead_steps", COUNT, True),
    ("member_tokens", _list("a list of token lists, one per batch member", TOKENS), True),
    ("tokens", TOKENS, True),
    ("text", TEXT, True),
    *_DECODE_QUALITY,
    ("needs_fallback", BOOL, True),
    ("fallback_reasons", _list("a list of strings", TEXT), True),
    ("kept", BOOL, True),
    ("skipped_as_silence", _or_null(BOOL), True),
    ("fast_filters", OBJECT, False),
    ("fast_picks", _list("a list of token lists, one per kept step", TOKENS), False),
    ("candidates", _list("a list of candidate objects", CANDIDATE), False),
    across={"member_tokens": _one_list_a_member},
)
SEGMENT_RULES = {
    "turns": _list("a list of turn objects", TURN),
    "rows": _list("a list of batch row objects", BATCH_ROW),
    "decode_calls": _list("a list of decode call objects", DECODE_CALL),
}

# -- what a transcription, a speculative or composed run, a server and a detokenizer said ------

WORD = _obj(
    "a word object", ("word", TEXT, True), ("start", NUMBER, True), ("end", NUMBER, True), ("probability", NUMBER, True)
)
SEGMENT = _obj(
    "a transcript segment object",
    ("id", COUNT, True),
    ("seek", COUNT, True),
    ("start", NUMBER, True),
    ("end", NUMBER, True),
    ("text", TEXT, True),
    ("tokens", TOKENS, True),
    *_DECODE_QUALITY,
    ("words", _list("a list of word objects", WORD), False),
)
TRANSCRIPT = _obj(
    "a transcript object",
    ("text", TEXT, True),
    ("language", TEXT, True),
    ("segments", _list("a list of segment objects", SEGMENT), True),
)
CACHE_LAYER = _obj(
    "a cache layer object",
    ("type", NAME, True),
    ("offset", COUNT, True),
    ("sha256", SHA256, True),
    ("bits", POSITIVE, False),
    ("group_size", POSITIVE, False),
    ("idx", INT, False),
)
CACHE = _list("a list of cache layer objects", CACHE_LAYER)
STEP = _obj(
    "a step object",
    ("from_draft", BOOL, False),
    ("verify_step", COUNT, False),
    ("drafted", COUNT, False),
    ("accepted", COUNT, False),
    ("target_offset", COUNT, False),
    ("draft_cache", CACHE, False),
    ("final_cache", CACHE, False),
)
_ANSWER = (
    ("initial_state", TEXT, True),
    ("tokens", TOKENS, True),
    ("stream", _list("a list of chunk objects", OBJECT), True),
    ("whole", OBJECT, True),
    ("moves", _list("a list of move objects", OBJECT), False),
)
SERVER_RESPONSE = _obj(
    "a server response object",
    ("generated", _obj("an answer object", *_ANSWER), True),
    (
        "forced",
        _list(
            "a list of forced answer objects",
            _obj("a forced answer object", ("id", NAME, True), ("text", TEXT, True), ("ids", TOKENS, True), *_ANSWER),
        ),
        True,
    ),
)
STREAM_TEXT = _list(
    "a list of stream text objects, one per segment",
    _obj("a stream text object", ("pieces", _list("a list of strings", TEXT), True), ("decoded", TEXT, True)),
)

# -- the record, field by field in the documented order ----------------------------------------

RECORD_FIELDS: tuple[tuple[str, Rule, bool], ...] = (
    ("scenario_id", NAME, True),
    ("rendered_prompt", _or_null(TEXT), True),
    ("prompt_ids", TOKENS, True),
    ("tokens", TOKENS, True),
    ("eos_ids", TOKENS, True),
    ("mode", _leaf(" or ".join(repr(m) for m in MODES), lambda v: v in MODES), False),
    ("arrays", _list("a list of tensor names", ARRAY_NAME), False),
    *((key, rule, False) for key, rule in SEGMENT_RULES.items()),
    ("transcript", TRANSCRIPT, False),
    ("step_info", _list("a list of step objects, one per token", STEP), False),
    ("finish_reason", _leaf(" or ".join(repr(r) for r in FINISH_REASONS), lambda v: v in FINISH_REASONS), False),
    ("server_response", SERVER_RESPONSE, False),
    ("stream_text", STREAM_TEXT, False),
)


def _unique_names(meta: dict[str, Any], _prefix: str) -> None:
    names = meta["arrays"]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise _Wrong(f"arrays[{i}]", "a tensor name not listed before it", _show(name))


def _segments(key: str) -> Callable[[dict[str, Any], str], None]:
    """A segment list's rows: one list a record, each segment starting where the one before it
    ends, all of them covering the tokens."""

    def check(meta: dict[str, Any], _prefix: str) -> None:
        first = next(k for k in SEGMENT_KEYS if k in meta)
        if first != key:
            raise _Wrong(key, f"to be absent (the record's segments are its {first})", "a second segment list")
        end = 0
        for i, segment in enumerate(meta[key]):
            if segment["row_offset"] != end:
                start = f"where {SEGMENT_KEYS[key]} {i - 1} ends" if i else "the first row"
                raise _Wrong(f"{key}[{i}].row_offset", f"{end} ({start})", _show(segment["row_offset"]))
            end += segment["n_steps"] * segment.get("batch", 1)
        if end != len(meta["tokens"]):
            raise _Wrong(key, f"segments covering the {len(meta['tokens'])} tokens", f"segments covering {end} rows")

    return check


def _one_step_a_token(meta: dict[str, Any], _prefix: str) -> None:
    n_tokens, n_steps = len(meta["tokens"]), len(meta["step_info"])
    if n_steps != n_tokens:
        raise _Wrong("step_info", f"one entry per token ({n_tokens})", f"{n_steps} entries")


def _one_text_a_segment(meta: dict[str, Any], _prefix: str) -> None:
    per_segment = next((len(meta[k]) for k in ("turns", "rows") if k in meta), 1)
    if len(meta["stream_text"]) != per_segment:
        raise _Wrong("stream_text", f"one entry per segment ({per_segment})", f"{len(meta['stream_text'])} entries")


# What ties a field to those before it, checked right after the field itself.
ACROSS: Across = {
    "arrays": _unique_names,
    **{key: _segments(key) for key in SEGMENT_KEYS},
    "step_info": _one_step_a_token,
    "stream_text": _one_text_a_segment,
}


def check_meta(meta: dict[str, Any], where: str) -> None:
    """Raise a RecordError naming the first field of `meta` (a record's meta, scenario_id
    included) that is not what docs/records.md says, with its path and what was expected."""
    try:
        if not isinstance(meta, dict):
            raise _Wrong("record", "a JSON object", _show(meta))
        walk(meta, RECORD_FIELDS, across=ACROSS)
    except _Wrong as e:
        raise RecordError(f"{where}: {e}") from None


def check_result(result: Any, where: str) -> None:
    """Raise a RecordError naming the first wrong key of a generator's result.json (the records
    themselves are checked by `check_meta`): `records_version` (absent means 1), `scenarios`
    (id -> record, or {"error": message}), `environment`."""
    try:
        if not isinstance(result, dict):
            raise _Wrong("result", "a JSON object", _show(result))
        version = result.get("records_version", RECORDS_VERSION)
        if not _is_int(version) or version != RECORDS_VERSION:
            raise _Wrong(
                "records_version",
                f"{RECORDS_VERSION} (the records version this harness reads; absent means {RECORDS_VERSION})",
                _show(version),
            )
        scenarios = result.get("scenarios")
        if not isinstance(scenarios, dict):
            raise _Wrong("scenarios", "a JSON object of records by scenario id", _show(scenarios))
        for sid, entry in scenarios.items():
            if not isinstance(entry, dict):
                raise _Wrong(f"scenarios[{sid!r}]", "a record object or an error object", _show(entry))
            if "error" in entry and not isinstance(entry["error"], str):
                raise _Wrong(f"scenarios[{sid!r}].error", "a string (the oracle's message)", _show(entry["error"]))
        if not isinstance(result.get("environment"), dict):
            raise _Wrong(
                "environment", "a JSON object (the oracle's versions and device)", _show(result.get("environment"))
            )
    except _Wrong as e:
        raise RecordError(f"{where}: {e}") from None
