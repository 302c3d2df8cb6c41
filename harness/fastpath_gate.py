"""The L2 gate of the Whisper fast path: a token budget, every difference a near-tie.

The fast path (models/whisper/fast.py) computes the oracle's function with other roundings,
so its logits are not bit-identical and a token can flip where the oracle's choice was a
near-tie. `check_token_budget` judges three records of one clip:

- `golden`: the oracle's (mlx-whisper's) free-running record;
- `free`: the fast path's free-running record;
- `forced`: the fast path teacher-forced on the golden's tokens (the same rows as the
  golden), whose decode calls carry `fast_filters` (the call's logit filters) and
  `fast_picks` (per step and batch member, what the fast path would have appended), as
  `fast.fast_transcribe_record` writes them.

Rules:

1. Budget. A clip's tokens are the `tokens` of its decode calls that were kept and not
   skipped as silence, concatenated (text and timestamp tokens, no EOT: what the segments are
   cut from). The oracle's and the free-running fast path's sequences are aligned with
   difflib (`SequenceMatcher(autojunk=False)` opcodes); each non-equal opcode counts
   `max(oracle span, fast span)` tokens (a replaced token counts 1, an inserted or a
   deleted one 1). More than `budget` differing tokens fail.
2. Near-ties. On every greedy step of the teacher-forced run (rows of an ended sequence
   aside) the call's filters F are applied to both sides' pre-filter logits with the filter
   state of the oracle's prefix: ĝ = F(oracle), â = F(fast).
   (a) argmax ĝ must be the oracle's token: otherwise the fast path's rules are not the
       oracle's (a filter missing or changed);
   (b) argmax â must be the fast path's recorded pick: otherwise its compiled step does not
       apply the filters it declares;
   (c) where the pick differs from the oracle's token w, the flip must be a near-tie.
       Both tokens allowed on both sides: margin = ĝ[w] − ĝ[pick], error = how much the
       logit error moves that margin, |(a[w] − a[pick]) − (g[w] − g[pick])| (pre-filter
       logits a, g; `harness.compare.classify_flip`'s measure); near-tie iff margin <= error.
       A token allowed on one side and masked on the other: only the timestamp-probability
       rule reads logit values, so it decided differently: margin = the oracle's
       |timestamp log-prob − best text log-prob|, error = how much the fast side's logits
       move that difference; near-tie iff margin <= error. Anything else is not a near-tie.
   Any step failing (a), (b) or (c) fails the gate whatever the budget.
3. Every difference and every failure names the decode call, step, tokens, margin and error.

For two tokens both sides allow, (c) holds whenever the pick is the fast path's argmax (a
flip of a margin needs at least that much error): what rule 2 rejects is a rule-level
disagreement (a, b, or a flip onto a token the oracle's rules forbade). The size of the
logit error is bounded by the budget (and reported: `details["max_abs_logit_error"]`).
Sampled decode calls (T > 0, delegated to the faithful decoder) carry no picks: rule 2
skips them.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

import mlx.core as mx
import numpy as np

from harness.compare import CheckResult, top_k
from harness.records import ScenarioRecord
from models.whisper.fast_filters import FastFilters, FilterState

CHECK = "token_budget"


def clip_tokens(record: ScenarioRecord) -> list[int]:
    """The clip's tokens: every kept, not-skipped decode call's tokens, in order."""
    calls = record.extra.get("decode_calls")
    if calls is None:
        raise ValueError(f"{record.scenario_id} ({record.mode}): not a speech record (no decode_calls)")
    return [int(t) for c in calls if c.get("kept") and not c.get("skipped_as_silence") for t in c["tokens"]]


def token_differences(oracle: list[int], fast: list[int]) -> tuple[int, list[dict[str, Any]]]:
    """(differing token count, the non-equal difflib opcodes with both sides' tokens)."""
    matcher = difflib.SequenceMatcher(None, oracle, fast, autojunk=False)
    diffs = [
        {"op": op, "oracle_at": i1, "oracle": oracle[i1:i2], "fast_at": j1, "fast": fast[j1:j2]}
        for op, i1, i2, j1, j2 in matcher.get_opcodes()
        if op != "equal"
    ]
    return sum(max(len(d["oracle"]), len(d["fast"])) for d in diffs), diffs


def check_token_budget(
    golden: ScenarioRecord, free: ScenarioRecord, forced: ScenarioRecord, budget: int
) -> CheckResult:
    if budget < 0:
        raise ValueError(f"token budget must be >= 0, got {budget}")
    if getattr(golden, "is_compact", False):
        raise ValueError(
            f"{golden.scenario_id}: the token-budget gate needs the oracle's full logit vectors, "
            "got a compact golden: pass ParitySession.full_golden(profile, scenario)"
        )
    problems: list[str] = []
    count, diffs = token_differences(clip_tokens(golden), clip_tokens(free))
    diff_text = "; ".join(
        f"{d['op']} at oracle token {d['oracle_at']}: oracle {d['oracle']} vs fast {d['fast']}" for d in diffs
    )
    if count > budget:
        problems.append(f"{count} differing tokens over the budget of {budget} ({diff_text})")

    flips, rule_failures, steps_checked, max_error = _near_ties(golden, forced)
    problems += rule_failures
    problems += [f["explanation"] for f in flips if not f["near_tie"]]
    near = [f for f in flips if f["near_tie"]]
    summary_flips = "; ".join(f["explanation"] for f in near)
    details = {
        "budget": budget,
        "differing_tokens": count,
        "differences": diffs,
        "flips": flips,
        "steps_checked": steps_checked,
        "max_abs_logit_error": max_error,
    }
    if problems:
        return CheckResult(
            CHECK,
            False,
            f"{len(problems)} problem(s): " + " | ".join(problems),
            first_bad_step=next((f["row"] for f in flips if not f["near_tie"]), None),
            steps_compared=steps_checked,
            steps_differing=len(flips),
            details=details,
        )
    return CheckResult(
        CHECK,
        True,
        f"{count}/{budget} differing tokens{' (' + diff_text + ')' if diffs else ''}; "
        f"{steps_checked} teacher-forced steps checked, {len(flips)} flip(s), all near-ties"
        f"{': ' + summary_flips if summary_flips else ''}; max |logit error| {max_error:.3g}",
        steps_compared=steps_checked,
        steps_differing=len(flips),
        details=details,
    )


def _near_ties(golden: ScenarioRecord, forced: ScenarioRecord) -> tuple[list[dict[str, Any]], list[str], int, float]:
    """Rule 2 over the teacher-forced run: (flips, rule failures, steps checked, max |Δ| seen)."""
    g_calls = golden.extra.get("decode_calls") or []
    f_calls = forced.extra.get("decode_calls") or []
    if len(g_calls) != len(f_calls):
        return [], [f"the teacher-forced run made {len(f_calls)} decode calls, the oracle {len(g_calls)}"], 0, 0.0
    if forced.logits.shape != golden.logits.shape:
        return [], [f"teacher-forced logits {forced.logits.shape} vs the oracle's {golden.logits.shape}"], 0, 0.0
    flips: list[dict[str, Any]] = []
    failures: list[str] = []
    checked = 0
    max_error = 0.0
    eot = golden.eos_ids[0]
    for index, (g_call, f_call) in enumerate(zip(g_calls, f_calls, strict=True)):
        if "fast_picks" not in f_call:
            continue  # delegated to the faithful decoder (sampling): no greedy pick to judge
        if (f_call["n_steps"], f_call["batch"]) != (g_call["n_steps"], g_call["batch"]):
            failures.append(
                f"decode call {index}: teacher-forced {f_call['n_steps']} steps x {f_call['batch']}, "
                f"the oracle {g_call['n_steps']} x {g_call['batch']}"
            )
            continue
        filters = FastFilters.from_dict(f_call["fast_filters"])
        begin = filters.timestamps.begin if filters.timestamps is not None else filters.n_vocab
        masks = filters.masks()
        batch, offset = int(g_call["batch"]), int(g_call["row_offset"])
        for step in range(int(g_call["n_steps"])):
            for member in range(batch):
                row = offset + step * batch + member
                prefix = [golden.tokens[offset + j * batch + member] for j in range(step)]
                if prefix and prefix[-1] == eot:
                    continue  # an ended sequence appends EOT on both sides
                checked += 1
                where = f"decode call {index} step {step}" + (f" member {member}" if batch > 1 else "")
                g, a = golden.logits[row], forced.logits[row]
                max_error = max(max_error, float(np.max(np.abs(g.astype(np.float64) - a.astype(np.float64)))))
                state = FilterState.from_sampled([prefix], begin)
                g_hat = np.array(filters.apply(mx.array(g[None]), state, masks))[0]
                a_hat = np.array(filters.apply(mx.array(a[None]), state, masks))[0]
                want, pick = golden.tokens[row], int(f_call["fast_picks"][step][member])
                if int(np.argmax(g_hat)) != want:
                    failures.append(
                        f"{where}: the fast path's filters applied to the oracle's logits choose "
                        f"{int(np.argmax(g_hat))}, the oracle chose {want}: the decoding rules differ"
                    )
                if int(np.argmax(a_hat)) != pick:
                    failures.append(
                        f"{where}: the fast path picked {pick} but its declared filters on its own logits "
                        f"choose {int(np.argmax(a_hat))}: the compiled step's rules differ from its filters"
                    )
                if pick != want:
                    flips.append(_classify(where, row, want, pick, g, a, g_hat, a_hat, filters, state))
    return flips, failures, checked, max_error


def _classify(
    where: str,
    row: int,
    want: int,
    pick: int,
    g: np.ndarray,
    a: np.ndarray,
    g_hat: np.ndarray,
    a_hat: np.ndarray,
    filters: FastFilters,
    state: FilterState,
) -> dict[str, Any]:
    """Rule 2(c) for one flip: margin, error, near-tie, and the sentence that says so."""
    top2 = top_k(g_hat, 2)
    base = {
        "where": where,
        "row": row,
        "oracle_token": want,
        "fast_token": pick,
        "oracle_top2_margin": float(top2[0][1] - top2[1][1]),
    }
    allowed = [math.isfinite(float(x)) for x in (g_hat[want], g_hat[pick], a_hat[want], a_hat[pick])]
    if all(allowed):
        margin = float(g_hat[want]) - float(g_hat[pick])
        error = abs((float(a[want]) - float(a[pick])) - (float(g[want]) - float(g[pick])))
        kind = "logits"
    elif allowed[0] == allowed[2] and allowed[1] == allowed[3]:
        margin, error, kind = math.inf, 0.0, "rules"
    else:  # the only logit-dependent rule decided differently on the two sides
        if filters.timestamps is None:
            margin, error, kind = math.inf, 0.0, "rules"
        else:
            g_in = filters.before_timestamp_rules(mx.array(g[None]), state)
            a_in = filters.before_timestamp_rules(mx.array(a[None]), state)
            g_ts, g_text = (float(np.array(x)[0]) for x in filters.timestamp_logprobs(g_in))
            a_ts, a_text = (float(np.array(x)[0]) for x in filters.timestamp_logprobs(a_in))
            margin = abs(g_ts - g_text)
            error = abs((a_ts - a_text) - (g_ts - g_text))
            kind = "timestamp rule"
    near = bool(math.isfinite(margin) and margin <= error)
    what = {
        "logits": f"oracle margin {margin:.3g} between them, the logit error moves it by {error:.3g}",
        "timestamp rule": f"the timestamp-probability rule decided differently: oracle margin "
        f"{margin:.3g} (timestamp vs best text log-prob), the logit error moves it by {error:.3g}",
        "rules": "the oracle's rules forbid the fast path's token (or allow one the fast path forbade)",
    }[kind]
    verdict = "near-tie" if near else "NOT a near-tie"
    explanation = f"{where}: oracle {want} vs fast {pick}: {verdict}: {what}"
    return base | {"margin": margin, "error": error, "kind": kind, "near_tie": near, "explanation": explanation}
