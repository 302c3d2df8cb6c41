"""Waivers: a failing check that a person has accepted, for a stated reason, until a date.

`waivers.yaml` (repo root) is a list of entries, validated strictly at the edge so a typo
cannot silently waive nothing (or everything):

    - check: minicpm5-2b/*/decode_logits   # model/scenario/check: the model named literally; the
                                            # scenario and check each literally, or by a glob
                                            # anchored on a whole word of the name (*_logits)
      reason: "mlx 0.32.4 GEMV tail differs on M3; upstream issue 1234"
      owner: alice
      expires: 2027-01-31                   # valid through this day (UTC); after it, it blocks;
                                            # at most a year ahead (`horizon`)

A waiver only ever turns a failing or erroring check into WAIVED; it never hides that the
check failed. An expired waiver blocks the sign-off whatever it matches: a waiver nobody
renewed is a decision nobody is making any more.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.errors import HarnessError

WAIVER_KEYS = ("check", "reason", "owner", "expires")
_PART = re.compile(r"[A-Za-z0-9_.*?\[\]!-]+")
_GLOB = "*?[]!"  # fnmatch's special characters (`!` negates a [...] set)
_BRACKETS = re.compile(r"\[!?\]?[^\]]*\]")  # a [...] set: matches any of its characters, names none
# The literal start of a glob (`decode_*`, `spec-*-k2`) or its literal end (`*_logits`, `*-k2`): whole
# words of a name, cut at a separator, at least two letters or digits. Anything looser (`*o*`, `?*t*`,
# `*s`, `d*`) pins down nothing a reader can name, and would waive checks nobody meant to.
_HEAD = re.compile(r"(?=.*[A-Za-z0-9]{2})[A-Za-z0-9]+(?:[-_.][A-Za-z0-9]+)*[-_.]")
_TAIL = re.compile(r"(?=.*[A-Za-z0-9]{2})[-_.][A-Za-z0-9]+(?:[-_.][A-Za-z0-9]+)*")


class WaiverError(HarnessError):
    """The waivers file is malformed: names the file, the entry and the key."""


@dataclass(frozen=True)
class Waiver:
    check: str  # "model/scenario/check": a literal model, scenario and check fnmatch patterns
    reason: str
    owner: str
    expires: dt.date

    def matches(self, check_id: str) -> bool:
        """Part by part, so `*` never spans a '/' (a model glob cannot swallow a scenario)."""
        parts, patterns = check_id.split("/"), self.check.split("/")
        return len(parts) == len(patterns) and all(
            fnmatch.fnmatchcase(p, pat) for p, pat in zip(parts, patterns, strict=True)
        )

    def expired(self, today: dt.date) -> bool:
        return today > self.expires

    def as_dict(self) -> dict[str, str]:
        return {"check": self.check, "reason": self.reason, "owner": self.owner, "expires": self.expires.isoformat()}


def load_waivers(path: Path) -> list[Waiver]:
    """Read and validate a waivers file; an absent file means no waivers (not an error)."""
    if not path.exists():
        return []
    if path.is_fifo() or path.is_char_device() or path.is_socket():  # reading would block, or never end
        raise WaiverError(f"{path}: not a regular file: expected a UTF-8 YAML file, a list of waivers")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise WaiverError(
            f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): "
            "expected a UTF-8 YAML file, a list of waivers"
        ) from None
    except OSError as e:
        raise WaiverError(
            f"{path}: cannot read the waivers file: {e.strerror or e}; expected a readable UTF-8 YAML file"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise WaiverError(f"{path}: not valid YAML: {e}") from e
    return parse_waivers(data, str(path))


def parse_waivers(data: Any, where: str, today: dt.date | None = None) -> list[Waiver]:
    """Validate waivers; `today` (UTC by default) bounds how far ahead one may expire."""
    if data is None:
        return []
    if not isinstance(data, list):
        raise WaiverError(f"{where}: expected a list of waivers, got {type(data).__name__}")
    waivers = [_parse_entry(entry, f"{where}: [{i}]", today) for i, entry in enumerate(data)]
    seen: dict[str, int] = {}
    for i, waiver in enumerate(waivers):
        if waiver.check in seen:
            raise WaiverError(
                f"{where}: [{i}].check: {waiver.check!r} is already waived by entry [{seen[waiver.check]}]"
            )
        seen[waiver.check] = i
    return waivers


def _parse_entry(entry: Any, where: str, today: dt.date | None) -> Waiver:
    if not isinstance(entry, dict):
        raise WaiverError(f"{where}: expected a mapping with keys {', '.join(WAIVER_KEYS)}, got {entry!r}")
    unknown = sorted(str(k) for k in entry if k not in WAIVER_KEYS)
    if unknown:
        raise WaiverError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(WAIVER_KEYS)}")
    for key in WAIVER_KEYS:
        if key not in entry:
            raise WaiverError(f"{where}.{key}: required")
    for key in ("check", "reason", "owner"):
        if not isinstance(entry[key], str) or not entry[key].strip():
            raise WaiverError(f"{where}.{key}: expected a non-empty string, got {entry[key]!r}")
    check = entry["check"].strip()
    parts = check.split("/")
    if len(parts) != 3 or not all(_PART.fullmatch(p) for p in parts):
        raise WaiverError(
            f"{where}.check: expected 'model/scenario/check' (the model named literally, globs allowed in the "
            f"scenario and check parts), got {entry['check']!r}"
        )
    model, scenario, name = parts
    if any(c in _GLOB for c in model):  # `*`, `[a-z]*`, `s*`: a waiver of every model is no waiver
        raise WaiverError(
            f"{where}.check: the model part must name a model literally, with no glob characters "
            f"({' '.join(_GLOB)}): one entry per model, like 'smollm2-135m/*/decode_logits'; "
            f"got {model!r} in {entry['check']!r}"
        )
    if scenario != "*" and not _names(scenario):  # `**`, `[a-z]*`, `*e*`: some scenarios, nobody knows which
        raise WaiverError(
            f"{where}.check: the scenario part must name a scenario literally (like 'plain'), be '*' for every "
            "scenario, or be a glob anchored on whole words of the name (like 'multibyte-*' or '*-k2'); "
            f"got {scenario!r} in {entry['check']!r}"
        )
    if not _names(name):  # `*`, `*o*`, `?*t*`, `[a-z]*`: every check, or any with an 'o' in it
        raise WaiverError(
            f"{where}.check: the check part must name a check literally (like 'decode_logits'), or be a glob "
            "anchored on whole words of the name (like '*_logits' or 'decode_*'), never one that matches "
            f"checks by a letter; got {name!r} in {entry['check']!r}"
        )
    expires = _parse_date(entry["expires"], where)
    latest = horizon(today or dt.datetime.now(dt.UTC).date())
    if expires > latest:  # 9999-12-31: a permanent waiver, a decision nobody will make again
        raise WaiverError(
            f"{where}.expires: the waiver of {check!r} expires on {expires.isoformat()}, more than a year ahead; "
            f"a waiver is renewed at least yearly: choose a date on or before {latest.isoformat()}"
        )
    return Waiver(check, entry["reason"].strip(), entry["owner"].strip(), expires)


def horizon(today: dt.date) -> dt.date:
    """The latest day a waiver read today may expire on: the same day next year (28 February
    for a 29 February)."""
    try:
        return today.replace(year=today.year + 1)
    except ValueError:
        return today.replace(year=today.year + 1, day=28)


def _names(part: str) -> bool:
    """Whether a scenario or check part names what it matches: no glob at all, or a glob whose
    literal start or end is whole words of a name (`_HEAD`, `_TAIL`)."""
    literal = [""]  # the literal runs between the glob pieces (`*`, `?`, a [...] set)
    i = 0
    while i < len(part):
        bracket = _BRACKETS.match(part, i) if part[i] == "[" else None
        if bracket or part[i] in "*?[":
            literal.append("")
            i = bracket.end() if bracket else i + 1
        else:
            literal[-1] += part[i]
            i += 1
    if len(literal) == 1:
        return True  # no glob: a name
    return bool(_HEAD.fullmatch(literal[0])) or bool(_TAIL.fullmatch(literal[-1]))


def _parse_date(value: Any, where: str) -> dt.date:
    # YAML turns an unquoted 2027-01-31 into a date; a quoted one stays a string. Both are fine,
    # a datetime (or anything else) is not: a waiver expires on a day, not at an instant.
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    if isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value.strip()):
        try:
            return dt.date.fromisoformat(value.strip())
        except ValueError:
            pass
    raise WaiverError(f"{where}.expires: expected a date YYYY-MM-DD, got {value!r}")
