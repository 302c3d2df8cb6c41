"""The L2 gate of the Whisper fast path: a calibrated budget and bound, every difference a near-tie.

The fast path (models/whisper/fast.py, fast_model.py) computes the oracle's function with other roundings,
so its logits are not bit-identical and a token can flip where the oracle's choice was a
near-tie. `check_token_budget` judges three records of one clip against the scenario's
calibration record (harness/goldens/calibration.py, written by `make calibrate ARGS=--write`):

- `golden`: the oracle's (mlx-whisper's) free-running record, full logits;
- `free`: the fast path's free-running record;
- `forced`: the fast path teacher-forced on the golden's tokens (the same rows as the
  golden), whose decode calls carry `fast_filters` (the call's logit filters) and
  `fast_picks` (per step and batch member, what the fast path would have appended), as
  `harness.runners.whisper_record.fast_transcribe_record` writes them.

Its rules, numbered 0-5 as the functions below cite them, are in docs/whisper-fast.md ("The L2
gate"): the record, the fast path ran, the per-step bound, the budget, near-ties, and where the
counted differences arise. Every difference and every failure names the decode call, step,
tokens, margin and error.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

import mlx.core as mx
import numpy as np

from harness.checks.compare import CheckResult, top_k
from harness.checks.tokens import is_near_tie, margin_shift
from harness.goldens.calibration import CalibrationRecord, StepBound
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


def measure(golden: ScenarioRecord, forced: ScenarioRecord) -> dict[str, Any]:
    """Rules 1, 2 (the measurement) and 4 over the teacher-forced run, without a record:
    {"steps": [StepBound...] (each step's max |logit error|), "flips": [...], "failures": [...]}.
    `make calibrate` records `steps`; the gate compares them with the record."""
    if getattr(golden, "is_compact", False):
        raise ValueError(
            f"{golden.scenario_id}: the token-budget gate needs the oracle's full logit vectors, "
            "got a compact golden: pass ParitySession.full_golden(profile, scenario)"
        )
    g_calls = golden.extra.get("decode_calls") or []
    f_calls = forced.extra.get("decode_calls") or []
    steps: list[StepBound] = []
    flips: list[dict[str, Any]] = []
    failures: list[str] = []
    if len(g_calls) != len(f_calls):
        failures.append(f"the teacher-forced run made {len(f_calls)} decode calls, the oracle {len(g_calls)}")
        return {"steps": steps, "flips": flips, "failures": failures}
    if forced.logits.shape != golden.logits.shape:
        failures.append(f"teacher-forced logits {forced.logits.shape} vs the oracle's {golden.logits.shape}")
        return {"steps": steps, "flips": flips, "failures": failures}
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
                where = f"decode call {index} step {step}" + (f" member {member}" if batch > 1 else "")
                g, a = golden.logits[row], forced.logits[row]
                finite_g, finite_a = np.isfinite(g), np.isfinite(a)
                if not np.array_equal(finite_g, finite_a):
                    failures.append(f"{where}: the fast path's logits are non-finite where the oracle's are not")
                error = float(
                    np.max(np.abs(g[finite_g & finite_a].astype(np.float64) - a[finite_g & finite_a]), initial=0.0)
                )
                steps.append(StepBound(index, step, member, error))
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
                    flip = _classify(where, row, want, pick, g, a, g_hat, a_hat, filters, state)
                    flips.append(flip | {"call": index, "step": step, "member": member})
    return {"steps": steps, "flips": flips, "failures": failures}


def check_token_budget(
    golden: ScenarioRecord,
    free: ScenarioRecord,
    forced: ScenarioRecord,
    budget: int,
    calibration: CalibrationRecord,
) -> CheckResult:
    if budget < 0:
        raise ValueError(f"token budget must be >= 0, got {budget}")
    problems: list[str] = []
    if budget != calibration.budget:
        problems.append(
            f"the profile's budget is {budget} differing tokens, its calibration record says "
            f"{calibration.budget}: a budget comes from `make calibrate`, not from an edit"
        )
    measured = measure(golden, forced)
    steps, flips = measured["steps"], measured["flips"]
    problems += measured["failures"]
    if not steps:
        problems.append(
            "the fast path decoded no greedy step (every decode call was delegated to the faithful "
            "decoder): nothing of the fast path was judged"
        )
    over, max_error = _bound(steps, calibration.steps, problems)
    count, diffs = token_differences(clip_tokens(golden), clip_tokens(free))
    diff_text = "; ".join(
        f"{d['op']} at oracle token {d['oracle_at']}: oracle {d['oracle']} vs fast {d['fast']}" for d in diffs
    )
    if count > budget:
        problems.append(f"{count} differing tokens over the budget of {budget} ({diff_text})")
    arising = _where_differences_arise(golden, free, forced, flips) if count else None
    if arising is not None and not arising["explained"]:
        problems.append(arising["explanation"])
    problems += [f["explanation"] for f in flips if not f["near_tie"]]
    near = [f for f in flips if f["near_tie"]]
    details = {
        "budget": budget,
        "differing_tokens": count,
        "differences": diffs,
        "arising": arising,
        "flips": flips,
        "steps_checked": len(steps),
        "max_abs_logit_error": max_error,
        "steps_over_bound": over,
        "calibration": {"budget": calibration.budget, "origin": calibration.origin},
    }
    if problems:
        return CheckResult(
            CHECK,
            False,
            f"{len(problems)} problem(s): " + " | ".join(problems),
            first_bad_step=next((f["row"] for f in flips if not f["near_tie"]), None),
            steps_compared=len(steps),
            steps_differing=len(flips),
            details=details,
        )
    summary_flips = "; ".join(f["explanation"] for f in near)
    return CheckResult(
        CHECK,
        True,
        f"{count}/{budget} differing tokens{' (' + diff_text + ')' if diffs else ''}"
        f"{'; ' + arising['explanation'] if arising else ''}; "
        f"{len(steps)} teacher-forced steps checked, every |logit error| within its calibrated bound "
        f"(max {max_error:.3g}), {len(flips)} flip(s), all near-ties{': ' + summary_flips if summary_flips else ''}",
        steps_compared=len(steps),
        steps_differing=len(flips),
        details=details,
    )


def _bound(measured: list[StepBound], recorded: tuple[StepBound, ...], problems: list[str]) -> tuple[list, float]:
    """Rule 2: every step's error within the record's number for that same step."""
    max_error = max((s.max_abs_logit_error for s in measured), default=0.0)
    where = [(s.call, s.step, s.member) for s in measured]
    if where != [(s.call, s.step, s.member) for s in recorded]:
        problems.append(
            f"the teacher-forced run checked {len(measured)} steps, the calibration record bounds "
            f"{len(recorded)} other ones: the record does not describe this run"
        )
        return [], max_error
    over = [
        {"where": m.where, "error": m.max_abs_logit_error, "bound": r.max_abs_logit_error}
        for m, r in zip(measured, recorded, strict=True)
        if not m.max_abs_logit_error <= r.max_abs_logit_error
    ]
    if over:
        shown = "; ".join(f"{o['where']}: {o['error']:.6g} > {o['bound']:.6g}" for o in over[:5])
        problems.append(
            f"the fast path's |logit error| against the oracle exceeds its calibrated bound at "
            f"{len(over)} of {len(measured)} steps ({shown}{'; ...' if len(over) > 5 else ''}): "
            "its arithmetic changed since calibration"
        )
    return over, max_error


def _where_differences_arise(
    golden: ScenarioRecord, free: ScenarioRecord, forced: ScenarioRecord, flips: list[dict[str, Any]]
) -> dict[str, Any]:
    """Rule 5: the first decode call where the free run leaves the oracle, and whether the
    teacher-forced run explains it there (a near-tie flip onto the free run's token)."""
    g_calls = golden.extra.get("decode_calls") or []
    v_calls = free.extra.get("decode_calls") or []
    f_calls = forced.extra.get("decode_calls") or []
    eot = golden.eos_ids[0]

    def unexplained(text: str) -> dict[str, Any]:
        return {"explained": False, "explanation": f"the counted differences are unexplained: {text}"}

    for index, (g, v) in enumerate(zip(g_calls, v_calls, strict=False)):
        g_tokens, v_tokens = [int(t) for t in g["tokens"]], [int(t) for t in v["tokens"]]
        if g_tokens == v_tokens:
            decision = ("kept", "skipped_as_silence", "seek", "temperature")
            if any(g.get(k) != v.get(k) for k in decision):
                return unexplained(
                    f"decode call {index} decoded the oracle's tokens but decided differently ("
                    + ", ".join(
                        f"{k}: oracle {g.get(k)!r}, fast {v.get(k)!r}" for k in decision if g.get(k) != v.get(k)
                    )
                    + ")"
                )
            continue
        step = next((i for i, (x, y) in enumerate(zip(g_tokens, v_tokens, strict=False)) if x != y), None)
        step = min(len(g_tokens), len(v_tokens)) if step is None else step
        fast_token = v_tokens[step] if step < len(v_tokens) else eot
        where = f"decode call {index} step {step}"
        if index >= len(f_calls) or "fast_picks" not in f_calls[index]:
            return unexplained(f"they arise at {where}, a call delegated to the faithful decoder (no greedy flip)")
        flip = next((f for f in flips if (f["call"], f["step"], f["member"]) == (index, step, 0)), None)
        if flip is None or flip["fast_token"] != fast_token:
            forced_pick = (
                int(f_calls[index]["fast_picks"][step][0]) if step < len(f_calls[index]["fast_picks"]) else None
            )
            return unexplained(
                f"the free run first differs at {where} (oracle "
                f"{g_tokens[step] if step < len(g_tokens) else eot}, fast {fast_token}), but teacher-forced on "
                f"the same prefix the fast path picks {forced_pick}: its free and teacher-forced runs disagree"
            )
        if not flip["near_tie"]:
            return unexplained(f"they arise at {where}, a flip that is not a near-tie")
        return {
            "explained": True,
            "call": index,
            "step": step,
            "explanation": f"every difference arises at {where}, a near-tie flip (teacher-forced there), "
            "or follows from it",
        }
    return unexplained(
        f"the free run made {len(v_calls)} decode calls, the oracle {len(g_calls)}, with no differing tokens in "
        "the calls both made"
    )


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
    """Rule 4(c) for one flip: margin, error, near-tie, and the sentence that says so."""
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
        margin, error = margin_shift(g, a, want, pick)
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
    near = is_near_tie(margin, error)
    what = {
        "logits": f"oracle margin {margin:.3g} between them, the logit error moves it by {error:.3g}",
        "timestamp rule": f"the timestamp-probability rule decided differently: oracle margin "
        f"{margin:.3g} (timestamp vs best text log-prob), the logit error moves it by {error:.3g}",
        "rules": "the oracle's rules forbid the fast path's token (or allow one the fast path forbade)",
    }[kind]
    verdict = "near-tie" if near else "NOT a near-tie"
    explanation = f"{where}: oracle {want} vs fast {pick}: {verdict}: {what}"
    return base | {"margin": margin, "error": error, "kind": kind, "near_tie": near, "explanation": explanation}


def judge_token_budget(context: Any) -> CheckResult:
    """The row's judge: the fast path's free and teacher-forced runs against the oracle's full
    vectors (margins need them) and the scenario's calibration record."""
    golden = context.full_golden()
    budget = int(context.scenario.composition["budget"]["max_differing_tokens"])
    return check_token_budget(
        golden, context.intree("free"), context.intree("teacher_forced"), budget, context.calibration(golden)
    )
