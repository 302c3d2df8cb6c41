"""`python -m harness bench-compiled --model NAME`: decode tok/s of the compiled step vs eager vs mlx-lm.

Three sides on the same prompt ids (the profile's longest single-prompt scenario, as
`harness.tools.bench` picks it), each in a process of its own that loads the model once and
runs one warm-up, then `--rounds` (default 15) paired rounds: every round times every side
once, back to back, in an order rotated by round (harness.tools.bench_paired):

- `eager`: the in-tree `greedy_steps` (gated bit-exact against mlx-lm by the goldens);
- `compiled`: `models.universal.compiled.compiled_greedy_steps` (its traces are made in the
  warm-up, as a server would make them once);
- `mlx_lm`: mlx-lm's own `generate_step`, through oracles/<oracle>/bench.py `--serve` in the
  oracle venv (or the interpreter `MLX_PARITY_ORACLE_PYTHON` names, as on the GPU machine).

Decode tok/s = steps / (last step - step 0), as harness.tools.bench measures it. Reported per
side: best-of, median, min..max and IQR over the rounds; per pair of sides: the same figures
of the per-round ratio (paired, so the load common to a round divides out). The warm-ups also
compare the compiled side's logits (sha256 of the raw bits) and tokens with the eager side's,
and mlx-lm's tokens with the eager side's: the result records `bit_exact_vs_eager`, and a speed
for a compiled loop that is not bit-exact is flagged in the table.

`--gate` runs the L1 step gates instead (prefill, decode and teacher-forced logits, greedy
tokens, EOS stop) of the profile's single-sequence scenarios with the compiled loop against
the mlx-lm goldens, and exits non-zero if any fails.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness import settings
from harness.errors import UsageError
from harness.profile import Profile
from harness.progress import progress
from harness.provenance import device_facts
from harness.tools.bench_common import (
    bench_prompt,
    loadavg,
    machine,
    machine_line,
    scratch_dir,
    speed_result,
    write_job,
    write_result,
)
from harness.tools.bench_paired import QUOTABLE_ROUNDS, Worker, fmt, ratio_stats, ready_and_paired, side_stats

# -- speed ----------------------------------------------------------------------------------------


def workers(profile: Profile, model_dir: Path, job: Path, variant: str, oracle: bool) -> list[Worker]:
    """The sides, each a process of its own (harness.tools.bench_paired), started in parallel."""
    root = Path(__file__).resolve().parents[2]
    intree = [sys.executable, "-m", "harness", "bench-worker", "--model-dir", str(model_dir), "--job", str(job)]
    sides = [
        Worker("eager", [*intree, "--side", "eager"], settings.environment(), root),
        Worker("compiled", [*intree, "--side", "compiled", "--variant", variant], settings.environment(), root),
    ]
    if oracle:
        sides.append(Worker.oracle("mlx_lm", profile.oracle, "bench.py", job, model_dir))
    return sides


def speed(
    profile: Profile,
    model_dir: Path,
    prompt_ids: list[int],
    steps: int,
    rounds: int,
    variant: str,
    oracle: bool,
) -> dict[str, Any]:
    """Warm-up in every side's process, then `rounds` paired rounds; stats per side and per-round ratios."""
    with tempfile.TemporaryDirectory(prefix="bench-compiled-", dir=scratch_dir()) as tmp:
        job = write_job(Path(tmp), prompt_ids, steps, repeats=1)
        sides = workers(profile, model_dir, job, variant, oracle)
        ready, runs = ready_and_paired(sides, rounds)
    result: dict[str, Any] = {name: side_stats(rs, steps, len(prompt_ids)) for name, rs in runs.items()}
    eager, compiled = ready["eager"], ready["compiled"]
    result["compiled"] |= {
        "variant": compiled["variant"],
        "compiled": compiled["compiled"],
        "bit_exact_vs_eager": eager["logits_sha256"] == compiled["logits_sha256"]
        and eager["tokens"] == compiled["tokens"],
        "warmup_run_s": compiled["warmup_run_s"],
    }
    result["eager"]["warmup_run_s"] = eager["warmup_run_s"]
    if oracle:
        result["mlx_lm"] |= {k: ready["mlx_lm"].get(k) for k in ("mlx", "mlx-lm", "device")}
        result["mlx_lm"]["same_tokens_as_eager"] = ready["mlx_lm"]["tokens"] == eager["tokens"]
    pairs = [("compiled", "eager")] + ([("eager", "mlx_lm"), ("compiled", "mlx_lm")] if oracle else [])
    result["ratios"] = {f"{a}/{b}": ratio_stats(result[a], result[b]) for a, b in pairs}
    result["order"] = "round r starts with side r mod n of " + ", ".join(w.name for w in sides)
    return result


def table(result: dict[str, Any]) -> str:
    s, m = result["speed"], result["machine"]
    c = s["compiled"]
    exact = "bit-exact vs eager" if c["bit_exact_vs_eager"] else "NOT BIT-EXACT vs eager"
    names = [n for n in ("eager", "compiled", "mlx_lm") if n in s]
    tokens = ""
    if "mlx_lm" in s:
        tokens = "; mlx-lm tokens " + ("equal" if s["mlx_lm"]["same_tokens_as_eager"] else "DIFFER")
    lines = [
        f"{result['model']}: prompt {result['prompt']['scenario']} ({result['prompt']['tokens']} tokens), "
        f"{result['steps']} greedy decode steps, {result['repeats']} paired rounds (every side once per "
        f"round, each side its own process); compiled variant {c['variant']} ({exact}{tokens}; "
        f"warm-up run incl. tracing {c['warmup_run_s']:.2f} s)",
        "",
        "| tok/s: best / median, IQR (min..max) | "
        + " | ".join(n for n in ("eager", "compiled", "mlx_lm") if n in s)
        + " |",
        "|---|" + "---:|" * sum(n in s for n in ("eager", "compiled", "mlx_lm")),
    ]
    for key, label in (("decode_tok_s", "decode"), ("prefill_tok_s", "prefill")):
        cells = [fmt(s[n][key]) for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "| per-round ratio: best / median, IQR (min..max) | decode | prefill |", "|---|---:|---:|"]
    for pair, r in s["ratios"].items():
        lines.append(f"| {pair} | {fmt(r['decode_tok_s'], 'x')} | {fmt(r['prefill_tok_s'], 'x')} |")
    if result["repeats"] < QUOTABLE_ROUNDS:
        lines += ["", f"{result['repeats']} rounds: fewer than {QUOTABLE_ROUNDS}, too few to quote a ratio"]
    lines += ["", machine_line(m)]
    return "\n".join(lines)


# -- gate ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def compiled_decode_in_runner(variant: str) -> Iterator[list[Any]]:
    """The in-tree runner's decode loops switched to the compiled one, for this block only;
    yields the list of every run's DecodeReport (which runs were compiled, which eager).

    LlamaRunner imports `models.universal.greedy_steps` when it runs, and chat_turn_steps
    calls generate's module-level greedy_steps; both names are swapped and put back."""
    import models.universal
    import models.universal.generate as generate
    from models.universal.compiled import DecodeReport, compiled_greedy_steps

    reports: list[DecodeReport] = []

    def compiled(*args: Any, **kwargs: Any) -> Iterator[Any]:
        reports.append(DecodeReport())
        return compiled_greedy_steps(*args, variant=variant, report=reports[-1], **kwargs)

    saved = models.universal.greedy_steps, generate.greedy_steps
    models.universal.greedy_steps = generate.greedy_steps = compiled
    try:
        yield reports
    finally:
        models.universal.greedy_steps, generate.greedy_steps = saved


def gate(session: Any, profile: Profile, variant: str, scenario_ids: list[str] | None) -> list[dict[str, Any]]:
    """Every single-sequence L1 scenario (plain, chat, turns) through the compiled loop, judged
    by the session's own checks against the goldens. (Not session.run_check: the session
    keeps the in-tree records it ran, and those would be the eager loop's.)"""
    from harness.checks import registry

    goldens = session.goldens(profile)
    runner = session.runner(profile)
    rows = []
    for scenario in profile.active_scenarios(device_facts().backend):
        if scenario.kind not in ("plain", "chat") or scenario.composition is not None or scenario.id not in goldens:
            continue
        if scenario_ids and scenario.id not in scenario_ids:
            continue
        spec = profile.scenario_spec(scenario)
        golden = goldens[scenario.id].record
        with compiled_decode_in_runner(variant) as reports:
            records = {"free": runner.run(spec), "teacher_forced": runner.run(spec, forced=golden)}
        ran = sorted({r.variant if r.compiled else "eager: " + "; ".join(r.reasons) for r in reports})
        # The step gates (logits rows, tokens, the stop) on the runs the compiled loop replaced.
        gates = [c for c in profile.checks(scenario) if registry.get(c).rows or registry.get(c).digest_tokens]
        for check in (c for c in gates if registry.get(c).run in records):
            result = registry.judge_pair(
                check, golden, records[registry.get(check).run], lambda s=scenario: session.full_golden(profile, s)
            )
            rows.append(
                {
                    "scenario": scenario.id,
                    "check": check,
                    "passed": result.passed,
                    "summary": result.summary,
                    "ran": ran,
                }
            )
    return rows


# -- CLI -----------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from harness.session import ParitySession
    from models.universal.compiled_step import VARIANTS

    if args.variant not in VARIANTS:
        raise UsageError(f"--variant: expected one of {VARIANTS}, got {args.variant!r}")
    if args.rounds < 1 or args.steps < 1:
        raise UsageError(f"--rounds and --steps: need at least 1, got {args.rounds} and {args.steps}")
    session = ParitySession()
    profile = session.profile(args.model)
    load_before = loadavg()
    if args.gate:
        with progress.task(f"bench_compiled: L1 gates of {profile.name} with the compiled decode ({args.variant})"):
            rows = gate(session, profile, args.variant, args.scenario)
        for row in rows:
            verdict = "PASS" if row["passed"] else "FAIL"
            print(f"{verdict}  {row['scenario']:<26} {row['check']:<22} [{', '.join(row['ran'])}] {row['summary']}")
        failed = sum(not r["passed"] for r in rows)
        compiled_rows = sum(not any(r.startswith("eager") for r in row["ran"]) for row in rows)
        print(
            f"bench_compiled --gate: {len(rows) - failed}/{len(rows)} passed ({profile.name}, {args.variant}); "
            f"{compiled_rows} of them on compiled runs, the rest on the eager loop (cache kinds not compiled)"
        )
        result: dict[str, Any] = {"model": profile.name, "variant": args.variant, "gate": rows}
        result["machine"] = machine(load_before)
        name = f"gate-compiled-{profile.name}"
    else:
        runner = session.runner(profile)
        scenario, ids = bench_prompt(profile, runner)
        model_dir = session.artifact(profile).model_dir
        label = "eager / compiled" + ("" if args.no_oracle else " / mlx-lm")
        with progress.task(f"bench_compiled: {args.rounds} paired rounds of {label}"):
            speeds = speed(profile, model_dir, ids, args.steps, args.rounds, args.variant, not args.no_oracle)
        result = speed_result(profile.name, args.steps, args.rounds, scenario, ids, speeds, load_before)
        print(table(result))
        failed = 0
        name = f"compiled-{profile.name}"
    write_result(result, name, args.out)
    return 1 if failed else 0
