"""`python -m harness bench-compiled --model NAME`: decode tok/s of the compiled step vs eager vs mlx-lm.

Three sides on the same prompt ids (the profile's longest single-prompt scenario, as
`harness.tools.bench` picks it), each one warm-up then `--repeats` timed runs interleaved by round
(the CPU here is shared; interleaving gives every side the same minutes):

- `eager`: the in-tree `greedy_steps` (gated bit-exact against mlx-lm by the goldens);
- `compiled`: `models.universal.compiled.compiled_greedy_steps` (its trace is made in the
  warm-up, as a server would make it once);
- `mlx_lm`: mlx-lm's own `generate_step`, through oracles/<oracle>/bench.py in the oracle
  venv (or the interpreter `MLX_PARITY_ORACLE_PYTHON` names, as on the GPU machine).

Decode tok/s = steps / (last step - step 0), as harness.tools.bench measures it. The warm-up runs
also compare the compiled side's logits and tokens with the eager side's in raw bits: the
result records `bit_exact_vs_eager`, and a speed for a compiled loop that is not bit-exact is
flagged in the table.

`--gate` runs the L1 step gates instead (prefill, decode and teacher-forced logits, greedy
tokens, EOS stop) of the profile's single-sequence scenarios with the compiled loop against
the mlx-lm goldens, and exits non-zero if any fails.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from harness.profile import Profile
from harness.progress import progress
from harness.provenance import device_facts
from harness.tools.bench_common import (
    bench_prompt,
    loadavg,
    machine,
    machine_line,
    oracle_runs,
    scratch_dir,
    speed_result,
    write_job,
    write_result,
)

# The step gates a compiled decode loop answers for (prompt identity is the tokenizer's).


# -- speed ---------------------------------------------------------------------------------------


def timed_run(steps_fn: Callable[..., Iterator[Any]], model: Any, prompt_ids: list[int], steps: int) -> tuple:
    """One greedy run of steps + 1 tokens: (prefill s, decode s, peak bytes, logits bits, tokens)."""
    import mlx.core as mx
    import numpy as np

    mx.synchronize()
    mx.reset_peak_memory()
    started = time.perf_counter()
    stamps, rows, tokens = [], [], []
    for step in steps_fn(model, prompt_ids, steps + 1):  # each Step's token is .item()'d: computed
        stamps.append(time.perf_counter())
        rows.append(step.logits)
        tokens.append(step.token)
    mx.synchronize()
    bits = np.stack([np.array(r.astype(mx.float32)).view(np.uint32) for r in rows])
    return stamps[0] - started, stamps[-1] - stamps[0], mx.get_peak_memory(), bits, tokens


def speed(
    profile: Profile,
    model_dir: Path,
    model: Any,
    prompt_ids: list[int],
    steps: int,
    repeats: int,
    variant: str,
    oracle: bool,
) -> dict[str, Any]:
    import numpy as np

    from models.universal import greedy_steps
    from models.universal.compiled import DecodeReport, compiled_greedy_steps

    report = DecodeReport()

    def compiled(model: Any, ids: list[int], n: int) -> Iterator[Any]:
        return compiled_greedy_steps(model, ids, n, variant=variant, report=report)

    sides: dict[str, Callable[..., Iterator[Any]]] = {"eager": greedy_steps, "compiled": compiled}
    warm = {name: timed_run(fn, model, prompt_ids, steps) for name, fn in sides.items()}
    first_trace_s = warm["compiled"][0] + warm["compiled"][1]
    bit_exact = bool(np.array_equal(warm["eager"][3], warm["compiled"][3]) and warm["eager"][4] == warm["compiled"][4])
    runs: dict[str, list[tuple[float, float, int]]] = {"eager": [], "compiled": [], "mlx_lm": []}
    facts: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-compiled-", dir=scratch_dir()) as tmp:
        job = write_job(Path(tmp), prompt_ids, steps, repeats=1)
        for _ in range(repeats):
            for name, fn in sides.items():
                runs[name].append(timed_run(fn, model, prompt_ids, steps)[:3])
            if oracle:
                raw = oracle_runs(profile, model_dir, job)
                runs["mlx_lm"] += zip(raw["prefill_s"], raw["decode_s"], raw["peak_bytes"], strict=True)
                facts = {k: raw[k] for k in ("mlx", "mlx-lm", "device")}
    result = {
        side: {
            "decode_tok_s": steps / statistics.median([r[1] for r in rs]),
            "prefill_tok_s": len(prompt_ids) / statistics.median([r[0] for r in rs]),
            "decode_s": [r[1] for r in rs],
            "peak_memory_gb": max(r[2] for r in rs) / 1e9,
        }
        if rs
        else None
        for side, rs in runs.items()
    }
    result["compiled"] |= {
        "variant": report.variant,
        "compiled": report.compiled,
        "bit_exact_vs_eager": bit_exact,
        "warmup_run_s": first_trace_s,
    }
    if result["mlx_lm"]:
        result["mlx_lm"] |= facts
    return result


def table(result: dict[str, Any]) -> str:
    s, m = result["speed"], result["machine"]
    c = s["compiled"]
    exact = "bit-exact vs eager" if c["bit_exact_vs_eager"] else "NOT BIT-EXACT vs eager"
    lines = [
        f"{result['model']}: prompt {result['prompt']['scenario']} ({result['prompt']['tokens']} tokens), "
        f"{result['steps']} greedy decode steps, median of {result['repeats']} interleaved rounds; "
        f"compiled variant {c['variant']} ({exact}; warm-up run incl. tracing {c['warmup_run_s']:.2f} s)",
        "",
        "| tok/s | eager (in-tree) | compiled (in-tree) | mlx-lm | compiled / mlx-lm | compiled / eager |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key, label in (("decode_tok_s", "decode"), ("prefill_tok_s", "prefill")):
        oracle = s["mlx_lm"][key] if s["mlx_lm"] else None
        ratio = f"{c[key] / oracle:.2f}x" if oracle else "not measured"
        lines.append(
            f"| {label} | {s['eager'][key]:.2f} | {c[key]:.2f} | {oracle if oracle is None else f'{oracle:.2f}'} "
            f"| {ratio} | {c[key] / s['eager'][key]:.2f}x |"
        )
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
            result = registry.judge(
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness bench-compiled", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="profile name")
    parser.add_argument("--steps", type=int, default=32, help="greedy decode steps per timed run")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (the median is reported)")
    parser.add_argument("--variant", default="auto", help="compiled form: auto, whole, split, masked")
    parser.add_argument("--no-oracle", action="store_true", help="time eager and compiled only")
    parser.add_argument("--gate", action="store_true", help="run the L1 step gates with the compiled loop instead")
    parser.add_argument("--scenario", action="append", help="with --gate: only these scenario ids")
    parser.add_argument("--out", type=Path, help="JSON output (default: a new file under reports/)")
    args = parser.parse_args(argv)

    from harness.session import ParitySession
    from models.universal.compiled import VARIANTS

    if args.variant not in VARIANTS:
        parser.error(f"--variant: expected one of {VARIANTS}, got {args.variant!r}")
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
        with progress.task(f"bench_compiled: {args.repeats} rounds of {label}"):
            speeds = speed(
                profile, model_dir, runner.model, ids, args.steps, args.repeats, args.variant, not args.no_oracle
            )
        result = speed_result(profile.name, args.steps, args.repeats, scenario, ids, speeds, load_before)
        print(table(result))
        failed = 0
        name = f"compiled-{profile.name}"
    write_result(result, name, args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
