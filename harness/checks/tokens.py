"""Token-level checks: the chosen tokens, the prompt, the stop, and what a decoding task
decided (decode calls, fallbacks, the transcript without its log-prob floats). A token that
differs is explained by the logits (margin, shift, near-tie)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from harness.checks.compare import CheckResult, compare_json, fmt_top, top_k, where
from harness.errors import NothingComparedError
from harness.records import ScenarioRecord


def compare_tokens(check: str, golden: ScenarioRecord, actual: ScenarioRecord) -> CheckResult:
    n = len(golden.tokens)
    if n == 0:
        raise NothingComparedError(f"{check}: nothing to compare: the golden has no tokens")
    for step in range(n):
        got = actual.tokens[step] if step < len(actual.tokens) else None
        if got != golden.tokens[step]:
            top2 = top_k(golden.logits[step], 2)
            margin = top2[0][1] - top2[1][1]
            tie = classify_flip(golden, actual, step)
            return CheckResult(
                check,
                False,
                f"token trajectories diverge at step {step}{where(golden, step)}: oracle {golden.tokens[step]} "
                f"vs in-tree {got}; "
                f"oracle top-2 margin there {margin:.6g} (top-2 {fmt_top(top2)}); {tie['explanation']}",
                first_bad_step=step,
                steps_compared=n,
                steps_differing=n - step,
                details={
                    "oracle_token": golden.tokens[step],
                    "intree_token": got,
                    "oracle_top2_margin": margin,
                    "flip": tie,
                },
            )
    if len(actual.tokens) != n:
        return CheckResult(
            check,
            False,
            f"in-tree produced {len(actual.tokens)} tokens, oracle {n}",
            first_bad_step=min(n, len(actual.tokens)),
        )
    return CheckResult(check, True, f"{n} greedy tokens identical", steps_compared=n)


def margin_shift(expected: np.ndarray, actual: np.ndarray, want: int, got: int) -> tuple[float, float]:
    """(the expected side's margin of `want` over `got`, how much the actual side moves it).

    margin = e[want] - e[got] (>= 0 when the expected side preferred `want` on these logits);
    shift = |(a[want] - a[got]) - (e[want] - e[got])|, computed in float64."""
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    margin = float(e[want] - e[got])
    return margin, float(abs((a[want] - a[got]) - margin))


def is_near_tie(margin: float, shift: float) -> bool:
    """THE near-tie rule, for every gate that explains a flip (L1 diagnostics, the fast-path
    gate, calibration): the logit error moves the decisive margin by at least the margin itself.
    A negative or non-finite margin is never a near-tie (a rule, not a rounding, chose)."""
    return bool(math.isfinite(margin) and math.isfinite(shift) and 0.0 <= margin <= shift)


def classify_flip(golden: ScenarioRecord, actual: ScenarioRecord, step: int) -> dict[str, Any]:
    """Why a greedy token differs: a near-tie or not (`is_near_tie` on `margin_shift`).

    Near-tie: the two tokens' logits differ between the sides by at least as much as the
    oracle's margin between them, so a logit error that small explains the flip. Otherwise the
    flip is a real disagreement (or the in-tree logits at that step are not comparable).
    """
    want = golden.tokens[step]
    got = actual.tokens[step] if step < len(actual.tokens) else None
    members = _ranked_members(golden, step)
    if members > 1:
        return {
            "near_tie": False,
            "ranked": members,
            "explanation": f"not classified: a row of a decode call with {members} members (beam search or best-of), "
            "where whole sequences are ranked by their summed log-probabilities, so one row's logits do not "
            "explain its token; the first differing row is where the member sequences part",
        }
    if got is None or step >= actual.logits.shape[0] or actual.logits.shape[1:] != golden.logits.shape[1:]:
        return {"near_tie": False, "explanation": "not a near-tie: the in-tree logits at that step are missing"}
    g, a = golden.logits[step].astype(np.float64), actual.logits[step].astype(np.float64)
    bad = [side for side, row in (("oracle", g), ("in-tree", a)) if not np.isfinite(row[[want, got]]).all()]
    if bad:
        values = ", ".join(
            f"{side} {want}: {row[want]}, {got}: {row[got]}" for side, row in (("oracle", g), ("in-tree", a))
        )
        return {
            "near_tie": False,
            "non_finite": bad,
            "explanation": f"not a near-tie: non-finite logits on the {' and '.join(bad)} side at that step ({values})",
        }
    oracle_margin, shift = margin_shift(g, a, want, got)  # margin >= 0: the oracle preferred `want`
    if oracle_margin < 0:
        return {
            "near_tie": False,
            "oracle_margin": oracle_margin,
            "margin_shift": shift,
            "explanation": f"not a near-tie: the oracle chose {want} although its raw logit is below {got}'s "
            "(a logit filter, forcing or sampling chose it): the decoding rules differ",
        }
    near = is_near_tie(oracle_margin, shift)
    explanation = (
        f"near-tie: the oracle preferred {want} over {got} by {oracle_margin:.3g}, and the logit "
        f"difference between the sides moves that margin by {shift:.3g}: the logit error explains the flip"
        if near
        else f"not a near-tie: the oracle preferred {want} over {got} by {oracle_margin:.3g}, the sides "
        f"move that margin by only {shift:.3g}: the token choice itself differs (decoding rule, sampling)"
    )
    return {
        "near_tie": near,
        "oracle_margin": oracle_margin,
        "margin_shift": shift,
        "explanation": explanation,
    }


def _ranked_members(record: ScenarioRecord, row: int) -> int:
    """How many members the speech decode call holding `row` ranks (1: a greedy row). Batch rows
    of an LLM scenario are each their own greedy run: 1."""
    if "decode_calls" not in record.extra:
        return 1
    for seg in record.segments():
        if seg.row_offset <= row < seg.row_offset + seg.n_steps * seg.batch:
            return seg.batch
    return 1


def _first_difference(a: Sequence, b: Sequence) -> int:
    """Index of the first differing item; the shorter length when one is a prefix of the other."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def compare_prompt(check: str, golden: ScenarioRecord, actual: ScenarioRecord) -> CheckResult:
    """Rendered prompt and token ids identical; for turns and batch rows, each one's."""
    for key in ("turns", "rows"):
        if key in golden.extra:
            mine = actual.extra.get(key, [])
            if len(mine) != len(golden.extra[key]):
                return CheckResult(check, False, f"{len(golden.extra[key])} {key} in the oracle, {len(mine)} in-tree")
            for i, (g, a) in enumerate(zip(golden.extra[key], mine, strict=True)):
                one = _prompt_difference(
                    check, g["rendered_prompt"], g["prompt_ids"], a["rendered_prompt"], a["prompt_ids"]
                )
                if one is not None:
                    one.summary = f"{key[:-1]} {i}: {one.summary}"
                    return one
            total = sum(len(g["prompt_ids"]) for g in golden.extra[key])
            return CheckResult(check, True, f"{len(mine)} {key}' rendered prompts and {total} token ids identical")
    if not golden.prompt_ids:
        raise NothingComparedError(f"{check}: nothing to compare: the golden has no prompt token ids")
    one = _prompt_difference(
        check, golden.rendered_prompt, golden.prompt_ids, actual.rendered_prompt, actual.prompt_ids
    )
    return one or CheckResult(check, True, f"rendered prompt and {len(golden.prompt_ids)} token ids identical")


def _prompt_difference(
    check: str, golden_text: str | None, golden_ids: list[int], actual_text: str | None, actual_ids: list[int]
) -> CheckResult | None:
    """The rendered text first (20 characters around the difference), then the token ids (3
    before, 5 from the difference on, so a shared leading BOS stays in view), with a one-token
    insertion or deletion named (a doubled BOS reads as one, not as a different first token)."""
    for what, unit, g, t, before, after in (
        ("rendered prompts", "character", golden_text or "", actual_text or "", 20, 20),
        ("prompt token ids", "position", golden_ids, actual_ids, 3, 5),
    ):
        if g != t:
            at = _first_difference(g, t)
            shown = f" from position {max(0, at - before)}" if unit == "position" else ""
            return CheckResult(
                check,
                False,
                f"{what} differ at {unit} {at}: oracle {_around(g, at, before, after)} vs in-tree "
                f"{_around(t, at, before, after)}{shown} (lengths {len(g)} vs {len(t)}){_one_more(g, t, at, unit)}",
                details={"oracle": g, "intree": t},
            )
    return None


def _one_more(g: Any, t: Any, at: int, unit: str) -> str:
    """`; in-tree has one extra token 1 at position 1 (token 1 twice: ...)` where one side is the
    other with one element inserted at the first difference; empty otherwise."""
    for side, longer, shorter in (("in-tree", t, g), ("the oracle", g, t)):
        if len(longer) == len(shorter) + 1 and longer[:at] + longer[at + 1 :] == shorter:
            extra = longer[at]
            what = f"token {extra}" if unit == "position" else f"character {extra!r}"
            twice = ""
            if at > 0 and longer[at - 1] == extra:
                twice = f" ({what} twice in a row: added both by the template and by the tokenizer?)"
            return f"; {side} has one extra {what} at {unit} {at}{twice}"
    return ""


def _around(seq: Any, at: int, before: int, after: int) -> str:
    part = seq[max(0, at - before) : at + after]
    return repr(part) if isinstance(seq, str) else str(part)


def compare_eos(check: str, golden: ScenarioRecord, actual: ScenarioRecord) -> CheckResult:
    if sorted(golden.eos_ids) != sorted(actual.eos_ids):
        return CheckResult(
            check, False, f"EOS id sets differ: oracle {sorted(golden.eos_ids)} vs in-tree {sorted(actual.eos_ids)}"
        )
    if "finish_reason" in golden.extra:  # `stop: eos`: both runs ended themselves, as stream_generate does
        ends = [(len(r.tokens), r.extra.get("finish_reason")) for r in (golden, actual)]
        if ends[0] != ends[1]:
            return CheckResult(
                check,
                False,
                f"the runs end differently: oracle after {ends[0][0]} tokens ({ends[0][1]}), in-tree after "
                f"{ends[1][0]} tokens ({ends[1][1]}) (EOS ids {sorted(golden.eos_ids)})",
                first_bad_step=min(ends[0][0], ends[1][0]) - 1,
                details={"oracle_end": ends[0], "intree_end": ends[1]},
            )
        how = f"at EOS (step {golden.eos_step})" if ends[0][1] == "stop" else "at the step limit, without EOS"
        return CheckResult(
            check, True, f"EOS ids {sorted(golden.eos_ids)} identical; both runs stop {how} after {ends[0][0]} tokens"
        )
    if len(golden.segments()) > 1:
        expected, got = golden.segment_eos_steps(), actual.segment_eos_steps()
        if expected != got:
            bad = next(i for i, (e, a) in enumerate(zip(expected, got, strict=False)) if e != a)
            return CheckResult(
                check,
                False,
                f"{golden.segments()[bad].label}: generation stops at different steps: oracle at {expected[bad]} vs "
                f"in-tree at {got[bad]} (EOS ids {sorted(golden.eos_ids)}; None = no EOS within the steps run)",
            )
        return CheckResult(
            check, True, f"EOS ids {sorted(golden.eos_ids)} identical; per segment both stop at {expected}"
        )
    if golden.eos_step != actual.eos_step:
        return CheckResult(
            check,
            False,
            f"generation stops at different steps: oracle at {golden.eos_step} vs in-tree at {actual.eos_step} "
            f"(EOS ids {sorted(golden.eos_ids)}; None = no EOS within the steps run)",
            first_bad_step=min(s for s in (golden.eos_step, actual.eos_step) if s is not None),
        )
    where = f"at step {golden.eos_step}" if golden.eos_step is not None else "not within the steps run"
    return CheckResult(check, True, f"EOS ids {sorted(golden.eos_ids)} identical; both stop {where}")


def fallback_decisions(record: ScenarioRecord) -> list[dict[str, Any]]:
    """Every decode call in full: window (seek, frames), attempt, temperature, batch, initial
    tokens, steps, tokens, text, avg log-prob, compression ratio, no-speech probability, and the
    fallback decision with its reasons: the whole temperature ladder, decision by decision."""
    return list(record.extra.get("decode_calls", []))


# Transcript fields computed from log-probabilities: an oracle in another framework (PyTorch)
# computes them with other bits, so a token-level comparison leaves them out.
LOGPROB_FIELDS = ("avg_logprob", "no_speech_prob", "probability")


def without_logprob_fields(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_logprob_fields(v) for k, v in value.items() if k not in LOGPROB_FIELDS}
    if isinstance(value, list):
        return [without_logprob_fields(v) for v in value]
    return value


def sorted_keys(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True))


def _decode_call_tokens(record: ScenarioRecord) -> list[dict[str, Any]]:
    """Each decode call's window, temperature, prompt and chosen tokens, and a beam search's
    finished candidates' tokens (no log-prob floats)."""
    keep = ("seek", "segment_frames", "attempt", "temperature", "initial_tokens", "n_steps", "batch")
    keep += ("member_tokens", "tokens", "text")
    calls = []
    for call in record.extra.get("decode_calls", []):
        entry = {k: call[k] for k in keep if k in call}
        if "candidates" in call:
            entry["candidates"] = [c["tokens"] for c in call["candidates"]]
        calls.append(entry)
    return calls


# A beam candidate's sum of log-probabilities, oracle (PyTorch: beam search is openai-whisper's)
# against in-tree (MLX): float32 sums of another framework's log-softmax, so not bits. Judged
# per term (its tokens and the EOT): measured on fox-beam5, message-beam5-patience and
# weather-beam5 (this CPU, 2026-12-06) the difference is 1.5e-4 to 2.6e-4 nats a term, the same
# for candidates sharing a prefix; a term dropped, counted twice or taken from the wrong row moves
# a sum by that token's whole log-probability. The bound is 4x the largest measured.
CANDIDATE_SUM_TOLERANCE = 1e-3  # nats per term


def _candidate_sums(golden: ScenarioRecord, actual: ScenarioRecord) -> tuple[CheckResult | None, int, float]:
    """Every beam candidate's sum within CANDIDATE_SUM_TOLERANCE nats a term (their tokens are
    already equal): (a failure or None, candidates compared, the largest |difference| a term)."""
    count, largest = 0, 0.0
    g_calls, a_calls = golden.extra.get("decode_calls", []), actual.extra.get("decode_calls", [])
    for index, (g, a) in enumerate(zip(g_calls, a_calls, strict=True)):
        for rank, (gc, ac) in enumerate(zip(g.get("candidates", []), a.get("candidates", []), strict=True)):
            terms = len(gc["tokens"]) + 1  # its tokens and the EOT that finished it
            diff = abs(float(gc["sum_logprob"]) - float(ac["sum_logprob"]))
            count, largest = count + 1, max(largest, diff / terms)
            if not diff <= CANDIDATE_SUM_TOLERANCE * terms:  # a NaN fails too
                return (
                    CheckResult(
                        "decode_tokens",
                        False,
                        f"decode call {index}, beam candidate {rank} (tokens identical): sum of log-probabilities "
                        f"oracle {gc['sum_logprob']!r} vs in-tree {ac['sum_logprob']!r}, |difference| {diff:.3g} > "
                        f"{CANDIDATE_SUM_TOLERANCE:g} nats x {terms} terms: the search scored this sequence "
                        "differently",
                        details={"call": index, "candidate": rank, "oracle": gc["sum_logprob"], "terms": terms}
                        | {"intree": ac["sum_logprob"], "tolerance_per_term": CANDIDATE_SUM_TOLERANCE},
                    ),
                    count,
                    largest,
                )
    return None, count, largest


def decode_tokens(golden: ScenarioRecord, actual: ScenarioRecord) -> CheckResult:
    """Every row's token (each beam row, each step), each decode call's chosen tokens, and a
    beam search's finished candidates: each one's tokens, in order and count, and its sum."""
    result = compare_tokens("decode_tokens", golden, actual)
    if not result.passed:
        return result
    calls = compare_json(
        "decode_tokens", "decode calls' chosen tokens", _decode_call_tokens(golden), _decode_call_tokens(actual)
    )
    if not calls.passed:
        return calls
    failed, count, largest = _candidate_sums(golden, actual)
    if failed is not None:
        return failed
    result.summary += f"; {len(_decode_call_tokens(golden))} decode calls chose identical tokens"
    if count:
        result.summary += (
            f"; {count} beam candidates with identical tokens, sums within {CANDIDATE_SUM_TOLERANCE:g} nats a term "
            f"(largest {largest:.3g} a term)"
        )
        result.details["candidate_sum_largest_difference_per_term"] = largest
    return result
