"""Each decode call's finished candidates: the sequences a speech decoding task ranks (beam
search's finished hypotheses, best-of-N samples, a greedy call's one sequence), each its sampled
tokens up to EOT and its summed log-probability, as the decoder's `finalize` handed them over.

A decode call's chosen tokens show only the winner; two implementations can agree on it while
finishing other candidates, or scoring them differently, which decides the winner on another
input. The judge compares, per decode call, the number of candidates first, then each
candidate's tokens and (at bits) its `sum_logprob` bit for bit (the same float32 value as a
Python float). An oracle whose record has no candidates (openai-whisper's generator does not
write them) is said so in the verdict, never passed over silently.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from harness.checks.compare import CheckResult, ulp_distance
from harness.records import ScenarioRecord

NOT_RECORDED = "finished candidates not compared: the oracle's record has none (its generator does not write them)"


def _calls(record: ScenarioRecord) -> list[dict[str, Any]]:
    return list(record.extra.get("decode_calls") or [])


def recorded(record: ScenarioRecord) -> bool:
    """Whether any decode call of `record` carries its finished candidates."""
    return any("candidates" in call for call in _calls(record))


def _same_bits(a: float, b: float) -> bool:
    if math.isnan(a) and math.isnan(b):
        return True  # both sides computed NaN (an fp16 sum): JSON keeps no payload to tell apart
    return struct.pack("<d", a) == struct.pack("<d", b)


def _name(index: int, call: dict[str, Any]) -> str:
    return f"decode call {index} (seek {call.get('seek')}, attempt {call.get('attempt')}, T={call.get('temperature')})"


def _fail(check: str, summary: str, **details: Any) -> CheckResult:
    return CheckResult(check, False, summary, details=details)


def judge_candidates(
    check: str, golden: ScenarioRecord, actual: ScenarioRecord, *, sums: bool
) -> tuple[CheckResult | None, str]:
    """(the first difference as a failed CheckResult, or None; a note for a passing summary).

    `sums`: compare each candidate's `sum_logprob` bit for bit (an oracle on another framework
    computes other bits: a token-level check compares the tokens only)."""
    if not recorded(golden):
        return None, NOT_RECORDED
    expected, got = _calls(golden), _calls(actual)
    n = 0
    for i, g_call in enumerate(expected):
        if "candidates" not in g_call:
            continue
        want = g_call["candidates"]
        if i >= len(got):
            return _fail(
                check,
                f"{_name(i, g_call)}: the oracle finished {len(want)} candidates; the in-tree run "
                f"made only {len(got)} decode calls",
                decode_call=i,
            ), ""
        have = got[i].get("candidates")
        if have is None:
            return _fail(
                check,
                f"{_name(i, g_call)}: the in-tree record has no finished candidates (the oracle finished {len(want)})",
                decode_call=i,
            ), ""
        if len(have) != len(want):
            return _fail(
                check,
                f"{_name(i, g_call)}: the oracle finished {len(want)} candidates, the in-tree run {len(have)} "
                f"(oracle tokens {[c['tokens'] for c in want]!s:.200}; in-tree {[c['tokens'] for c in have]!s:.200})",
                decode_call=i,
                oracle=want,
                intree=have,
            ), ""
        for j, (w, h) in enumerate(zip(want, have, strict=True)):
            failure = _candidate_difference(check, f"{_name(i, g_call)} candidate {j}", w, h, sums)
            if failure is not None:
                failure.details |= {"decode_call": i, "candidate": j}
                return failure, ""
        n += len(want)
    what = "tokens and float32 sums" if sums else "tokens; sums left out"
    return None, f"{n} finished candidates of {len(expected)} decode calls identical ({what})"


def _candidate_difference(
    check: str, where: str, want: dict[str, Any], have: dict[str, Any], sums: bool
) -> CheckResult | None:
    w_tokens, h_tokens = list(want["tokens"]), list(have["tokens"])
    if w_tokens != h_tokens:
        at = next((k for k, (x, y) in enumerate(zip(w_tokens, h_tokens, strict=False)) if x != y), None)
        if at is None:
            how = f"one ends where the other goes on (lengths {len(w_tokens)} vs {len(h_tokens)})"
        else:
            how = f"at position {at}: oracle {w_tokens[at]} vs in-tree {h_tokens[at]} (lengths {len(w_tokens)} vs "
            how += f"{len(h_tokens)})"
        return _fail(check, f"{where}: tokens differ {how}", oracle=w_tokens, intree=h_tokens)
    if not sums:
        return None
    w_sum, h_sum = float(want["sum_logprob"]), float(have["sum_logprob"])
    if _same_bits(w_sum, h_sum):
        return None
    ulps = int(ulp_distance(np.array([w_sum], np.float32), np.array([h_sum], np.float32))[0])
    return _fail(
        check,
        f"{where} (tokens identical): sum_logprob differs: oracle {w_sum!r} vs in-tree {h_sum!r} "
        f"({ulps} float32 ULP apart)",
        oracle=w_sum,
        intree=h_sum,
        ulp=ulps,
    )
