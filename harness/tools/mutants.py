"""Mutation testing of the gates: known faults injected into the in-tree implementations, each
of which the gates must catch (`make mutants`).

Every mutant is one plausible bug (a config slip, one ULP in one weight, a dropped decoding
rule, a forgotten cache, a changed KV option...). It is applied in process (a model hook, a
monkeypatch, or an edited scenario spec), judged by the real gates against the committed
goldens, and counts as *killed* when at least one of its checks fails that passes on the
unmutated implementation. The mutation score is killed / scored; anything below 100 % exits 1
and names the survivors. A mutant whose output is bit-identical to the unmutated
implementation's is *equivalent* (no gate can see a fault that changes nothing): it is reported
as such and not scored. A mutant whose failing checks fail on the unmutated implementation too
(no golden on this backend, an oracle that cannot run here) is *unjudged*, and one whose
scenario does not run on this backend is *not run*: neither is scored, both exit 1.

    .venv/bin/python -m harness mutants [--only NAME[,NAME] ...] [--model MODEL]

`--model` judges the chosen mutants on another model's scenario for them (`Mutant.on`: the
half-precision twins of a float32 mutant), e.g. on the GPU
`--only final-norm-eps,one-ulp --model minicpm5-2b-mini-bf16`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

from harness import settings
from harness.checks.registry import get as registry_check
from harness.fileio import atomic_write_json
from harness.tools.mutant_faults import Mutant
from harness.tools.mutant_list import MUTANTS

if TYPE_CHECKING:
    from harness.session import ParitySession


def registry() -> list[str]:
    """Every check a profile can name, in the session's registry order."""
    from harness.checks.registry import CHECKS

    return list(CHECKS)


def judge(mutant: Mutant, clean: ParitySession | None = None) -> dict[str, Any]:
    """The mutant through `ParitySession.run_check`, the path `make parity` takes (compact
    goldens decided by their digests, full vectors fetched only to explain a difference), on
    every check the scenario declares: per check "passed", "failed", "error" or "unjudged" (it
    fails on the unmutated implementation too, judged by `clean`, one session for a whole run)."""
    from harness.goldens.specs import runnable_spec
    from harness.session import ParitySession

    # Goldens are had for the judged scenario only (a nightly-tagged one included).
    scope = {mutant.model: {mutant.scenario}}
    clean = clean if clean is not None else ParitySession(selected_scenarios=scope)
    session = ParitySession(model_hook=mutant.hook, selected_scenarios=scope)
    profile = session.profile(mutant.model)
    scenario = profile.scenario(mutant.scenario)
    if mutant.spec_edits:
        session.intree_spec_edits[(profile.name, scenario.id)] = mutant.spec_edits
    started = time.perf_counter()
    with mutant.patch() if mutant.patch else contextlib.nullcontext():
        outcomes, summaries = _run_checks(session, mutant)
        mutated = session.intree(profile, scenario, "free") if set(outcomes.values()) == {"passed"} else None
    # A check that fails on the unmutated implementation as well cannot tell the fault: not a kill.
    caught = [c for c, o in outcomes.items() if o != "passed"]
    if caught:
        clean_outcomes, clean_summaries = _run_checks(clean, mutant, caught)
        for check in caught:
            if clean_outcomes[check] != "passed":
                outcomes[check] = "unjudged"
                summaries[check] += f"; unmutated: {clean_summaries[check]}"
    killed = any(o in ("failed", "error") for o in outcomes.values())
    equivalent = False
    if mutated is not None:
        # A survivor is only a gate weakness if the fault changes what the implementation computes:
        # compare with the unmutated implementation on the unedited scenario, bit for bit.
        unmutated = clean.runner(profile).run(runnable_spec(profile.scenario_spec(scenario)))
        equivalent = (
            unmutated.tokens == mutated.tokens
            and unmutated.logits.tobytes() == mutated.logits.tobytes()
            and all(unmutated.arrays[k].tobytes() == mutated.arrays[k].tobytes() for k in unmutated.arrays)
            and unmutated.extra == mutated.extra
        )
    return {
        "killed": killed,
        "equivalent": equivalent,
        "unjudged": not killed and "unjudged" in outcomes.values(),
        "outcomes": outcomes,
        "summaries": summaries,
        "seconds": time.perf_counter() - started,
    }


def _run_checks(
    session: ParitySession, mutant: Mutant, checks: list[str] | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """(outcome, summary) per check of the mutant's scenario (or the named ones) in `session`."""

    profile = session.profile(mutant.model)
    scenario = profile.scenario(mutant.scenario)
    outcomes: dict[str, str] = {}
    summaries: dict[str, str] = {}
    for check in checks if checks is not None else profile.checks(scenario):
        try:
            result = session.run_check(profile, scenario, check)
        except Exception as e:  # noqa: BLE001 - as make parity: a crash of any kind is an ERROR row, never a pass
            outcomes[check], summaries[check] = "error", f"{type(e).__name__}: {e}"
            continue
        outcomes[check] = "passed" if result.passed else "failed"
        summaries[check] = result.summary
        if "walked" in result.details:  # the declared paths this scenario walked (the golden's, not the mutant's)
            mutant.walked[check] = list(result.details["walked"])
    return outcomes, summaries


def exercised_lines(chosen: list[Mutant], clean: ParitySession) -> list[str]:
    """One line per path a check declares (harness/checks/exercise.py) on the mutants' models:
    the mutants whose scenario walked it, so a kill is known to come from the path it names."""
    from harness.checks import registry as checks

    lines = []
    for model in dict.fromkeys(m.model for m in chosen):
        profile = clean.profile(model)
        for check in checks.with_exercises():
            if not any(check in profile.checks(s) for s in profile.scenarios):
                continue
            for path in checks.get(check).exercises.declared(profile):
                who = [
                    f"{m.name} ({m.scenario})" for m in chosen if m.model == model and path in m.walked.get(check, [])
                ]
                said = ", ".join(who) if who else "no mutant's scenario (judged by the profile's make parity only)"
                lines.append(f"exercised {model} {check}: {path}: {said}")
    return lines


def matrix(judged: dict[str, dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(markdown lines of the check x mutant matrix, the registry checks with no kill).

    A cell: K the check failed on that mutant, E it errored, U it failed on the unmutated
    implementation too (not a kill), . it passed, blank not declared by the mutant's scenario.
    A check is killed by a mutant whose run it failed, or by a gate test (the registry's
    failing_tests) that shows it failing."""
    names = list(judged)
    lines = [
        "| check | " + " | ".join(names) + " | gate tests |",
        "|---|" + "---|" * len(names) + "---|",
    ]
    symbol = {"failed": "K", "error": "E", "unjudged": "U", "passed": "."}
    lacking = []
    for check in registry():
        cells = [symbol.get(judged[n]["outcomes"].get(check, ""), "") for n in names]
        tests = registry_check(check).failing_tests
        if "K" not in cells and not tests:
            lacking.append(check)
        shown = ", ".join(t.rsplit("::", 1)[-1] for t in tests) or "-"
        lines.append(f"| {check} | " + " | ".join(cells) + f" | {shown} |")
    return lines, lacking


def choose(only: list[str] | None, model: str | None) -> list[Mutant]:
    """The mutants named (comma- or space-separated; none: all), each retargeted to `model`.
    An unknown name, or a mutant with no scenario on `model`, is a ValueError naming it."""
    names = [n for arg in only or () for n in arg.split(",") if n]
    unknown = sorted(set(names) - {m.name for m in MUTANTS})
    if unknown:
        raise ValueError(f"unknown mutants {unknown}; known: {[m.name for m in MUTANTS]}")
    chosen = [m for m in MUTANTS if not names or m.name in names]
    if model is not None:
        elsewhere = [f"{m.name} ({', '.join(m.models())})" for m in chosen if model not in m.models()]
        if elsewhere:
            raise ValueError(f"no scenario on {model} for: {'; '.join(elsewhere)}")
    return [m.judged_on(model) for m in chosen]


def verdict_of(outcome: dict[str, Any]) -> str:
    if outcome.get("not_run"):
        return "NOT RUN"
    if outcome["killed"]:
        return "KILLED"
    return "UNJUDGED" if outcome["unjudged"] else "EQUIVALENT" if outcome["equivalent"] else "SURVIVED"


def run_record(chosen: list[Mutant], judged: dict[str, dict[str, Any]], model: str | None) -> dict[str, Any]:
    """One run's verdicts as `--json` writes them: the device, and per mutant where it was judged."""
    from harness.provenance import device_facts

    return {
        "device": device_facts().as_dict(),
        "model": model,
        "mutants": [
            {
                "name": m.name,
                "fault": m.fault,
                "model": m.model,
                "scenario": m.scenario,
                "verdict": verdict_of(judged[m.name]),
                "outcomes": judged[m.name]["outcomes"],
                "summaries": {c: t[:500] for c, t in judged[m.name]["summaries"].items()},
                "note": judged[m.name].get("note", ""),
                "seconds": round(judged[m.name]["seconds"], 1),
            }
            for m in chosen
        ],
    }


def summarize(runs: list[dict[str, Any]]) -> list[str]:
    """Markdown: one row per mutant, one column per run (its model and device key), each cell the
    verdict there and the checks that killed it; a blank cell: not chosen in that run."""
    columns = [f"{r['model'] or 'own models'} ({r['device']['key']})" for r in runs]
    names = list(dict.fromkeys(m["name"] for r in runs for m in r["mutants"]))
    lines = ["| mutant | " + " | ".join(columns) + " |", "|---|" + "---|" * len(runs)]
    for name in names:
        cells = []
        for run in runs:
            entry = next((m for m in run["mutants"] if m["name"] == name), None)
            if entry is None:
                cells.append("")
                continue
            killed_by = [c for c, o in entry["outcomes"].items() if o in ("failed", "error")]
            detail = ", ".join(killed_by) if killed_by else entry["note"]
            cells.append(f"{entry['verdict']} ({entry['scenario']}{': ' + detail if detail else ''})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def run(args: argparse.Namespace) -> int:
    if args.summarize:
        print("\n".join(summarize([json.loads(p.read_text(encoding="utf-8")) for p in args.summarize])))
        return 0
    try:
        chosen = choose(args.only, args.model)
    except ValueError as e:
        print(f"error: {e}")
        return 2
    settings.set_default("MLX_PARITY_LOCALIZE", "0")  # for this process: a mutant needs a verdict, not a module
    from harness.provenance import device_facts
    from harness.session import ParitySession

    backend = device_facts().backend
    scope: dict[str, set[str]] = {}
    for mutant in chosen:
        scope.setdefault(mutant.model, set()).add(mutant.scenario)
    clean = ParitySession(selected_scenarios=scope)  # the unmutated implementation, for the whole run
    rows, judged, by_verdict = [], {}, {}
    for mutant in chosen:
        profile = clean.profile(mutant.model)
        scenario = profile.scenario(mutant.scenario)
        if profile.runs_on(scenario, backend):
            outcome = judge(mutant, clean)
        else:
            note = f"{'/'.join(scenario.backends or ())} only; this is {backend}"
            outcome = {"not_run": True, "killed": False, "outcomes": {}, "summaries": {}, "seconds": 0.0, "note": note}
        judged[mutant.name] = outcome
        verdict = verdict_of(outcome)
        by_verdict.setdefault(verdict, []).append(mutant.name)
        caught = ", ".join(
            c + {"error": " (error)", "unjudged": " (unjudged)"}.get(o, "")
            for c, o in outcome["outcomes"].items()
            if o != "passed"
        )
        where = f"{mutant.model}/{mutant.scenario}"
        rows.append(
            f"| {mutant.name} | {mutant.fault} | {where} | {verdict} | {caught or outcome.get('note', '-')}"
            f" | {outcome['seconds']:.0f} |"
        )
        print(rows[-1], flush=True)
        for check, o in outcome["outcomes"].items():
            if o in ("error", "unjudged"):
                print(f"    {check}: {outcome['summaries'][check][:300]}", flush=True)
    survivors = by_verdict.get("SURVIVED", [])
    scored = len(survivors) + len(by_verdict.get("KILLED", []))
    print("\n| mutant | fault | judged on | verdict | failing checks | s |\n|---|---|---|---|---|---:|")
    print("\n".join(rows))
    lines, lacking = matrix(judged)
    print(
        "\ncheck x mutant (K failed, E error, U fails unmutated too, . passed, blank: not a check of that scenario):\n"
    )
    print("\n".join(lines))
    print("\n" + "\n".join(exercised_lines(chosen, clean)))
    unscored = [
        f"{label}: {', '.join(by_verdict[v])}"
        for v, label in (
            ("EQUIVALENT", "equivalent (output bit-identical to the unmutated one, not scored)"),
            ("UNJUDGED", "UNJUDGED (the failing checks fail on the unmutated implementation too, not scored)"),
            ("NOT RUN", f"NOT RUN on {backend} (not scored)"),
        )
        if by_verdict.get(v)
    ]
    print(
        f"\nmutation score: {scored - len(survivors)}/{scored} killed"
        + (f"; SURVIVED: {', '.join(survivors)}" if survivors else "")
        + "".join(f"; {u}" for u in unscored)
    )
    if args.json:
        atomic_write_json(args.json, run_record(chosen, judged, args.model))
    # Whether every check has a kill is a question about the whole list, not a chosen few.
    lacking = lacking if not args.only else []
    if lacking:
        print(f"checks with no kill (no mutant failed them, no gate test): {', '.join(lacking)}")
    return 1 if survivors or lacking or by_verdict.get("UNJUDGED") or by_verdict.get("NOT RUN") else 0
