"""`python -m harness bench --model NAME`: speed of the in-tree model vs mlx-lm, and what a warm parity costs.

Figures, all measured on this machine in one run (docs/benchmarks.md keeps the latest):

1. prefill and decode tok/s of the in-tree universal Llama (`greedy_steps`, in this process) and
   of mlx-lm (`generate_step`, through oracles/<oracle>/bench.py in the oracle venv), on the
   same prompt ids: one warm-up, then the median of `--repeats` timed runs, interleaved by round;
2. the wall time of a warm `python -m harness parity` (goldens present: no generation), set
   against the in-tree runs it contains (timed here, the same scenarios and modes) and the model
   load, so that what remains is the harness's own overhead; plus one cold oracle generation;
3. the machine facts the numbers depend on;
4. the in-tree speed once more with OpenBLAS preloaded (measured only: the default stays the
   wheel's reference BLAS, which the goldens' device key names).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import settings
from harness.errors import OracleError
from harness.paths import REPO_ROOT
from harness.profile import Profile
from harness.progress import progress
from harness.provenance import device_facts
from harness.tools.bench_common import (
    bench_prompt,
    loadavg,
    machine_line,
    oracle_runs,
    run_command,
    scratch_dir,
    speed_result,
    write_job,
    write_result,
)

OPENBLAS = Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0")


# -- 1. speed ----------------------------------------------------------------------------------


def time_intree(model: Any, prompt_ids: list[int], steps: int) -> tuple[float, float, int]:
    """One greedy run of steps + 1 tokens: (prefill s = call to step 0, decode s = step 0 to last
    step, peak bytes MLX allocated during the run, weights included)."""
    import mlx.core as mx

    from models.universal import greedy_steps

    mx.synchronize()
    mx.reset_peak_memory()
    started = time.perf_counter()
    stamps = [time.perf_counter() for _ in greedy_steps(model, prompt_ids, steps + 1)]  # each token is .item()'d
    mx.synchronize()
    return stamps[0] - started, stamps[-1] - stamps[0], mx.get_peak_memory()


def summarize(
    prompt_len: int, steps: int, prefill_s: list[float], decode_s: list[float], peaks: list[int]
) -> dict[str, Any]:
    return {
        "prefill_tok_s": prompt_len / statistics.median(prefill_s),
        "decode_tok_s": steps / statistics.median(decode_s),
        "peak_memory_gb": max(peaks) / 1e9 if peaks else None,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
    }


def intree_runs(model: Any, prompt_ids: list[int], steps: int, repeats: int) -> list[tuple[float, float, int]]:
    """Timed in-tree runs after one warm-up (the first run pays for allocations the next ones reuse)."""
    time_intree(model, prompt_ids, steps)  # warm-up
    return [time_intree(model, prompt_ids, steps) for _ in range(repeats)]


def openblas_runs(model: str, job: Path) -> dict[str, Any]:
    """The in-tree runs in a child process with OpenBLAS preloaded (this module, `--speed-only`)."""
    cmd = [sys.executable, "-m", "harness", "bench", "--model", model, "--speed-only", str(job)]
    out = run_command(cmd, env=settings.environment() | {"LD_PRELOAD": str(OPENBLAS)}, cwd=REPO_ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def speed(
    profile: Profile, model_dir: Path, model: Any, prompt_ids: list[int], steps: int, repeats: int
) -> dict[str, Any]:
    """In-tree, mlx-lm and in-tree + OpenBLAS, one timed run of each per round.

    The CPU here is shared, and its load changes by the minute: interleaving the sides gives each
    the same conditions, where timing one side after the other would compare different minutes.
    Each child process loads the model and warms up once per round.
    """
    runs: dict[str, list[tuple[float, float, int]]] = {"intree": [], "mlx_lm": [], "intree_openblas": []}
    facts: dict[str, dict[str, Any]] = {"intree": {"blas": device_facts().blas}}
    time_intree(model, prompt_ids, steps)  # warm-up
    with tempfile.TemporaryDirectory(prefix="bench-", dir=scratch_dir()) as tmp:
        job = write_job(Path(tmp), prompt_ids, steps, repeats=1)
        for _ in range(repeats):
            runs["intree"].append(time_intree(model, prompt_ids, steps))
            raw = oracle_runs(profile, model_dir, job)
            runs["mlx_lm"] += zip(raw["prefill_s"], raw["decode_s"], raw["peak_bytes"], strict=True)
            facts["mlx_lm"] = {k: raw[k] for k in ("mlx", "mlx-lm", "device", "blas_libraries")}
            if OPENBLAS.exists():  # `apt-get install libopenblas0-pthread`; otherwise not measured
                raw = openblas_runs(profile.name, job)
                runs["intree_openblas"] += zip(raw["prefill_s"], raw["decode_s"], raw["peak_bytes"], strict=True)
                facts["intree_openblas"] = {"blas": raw["blas"], "ld_preload": str(OPENBLAS)}
    return {
        side: (
            summarize(len(prompt_ids), steps, [r[0] for r in rs], [r[1] for r in rs], [r[2] for r in rs]) | facts[side]
        )
        if rs
        else None
        for side, rs in runs.items()
    }


# -- 2. harness overhead ------------------------------------------------------------------------


def intree_parity_work(session: Any, profile: Profile) -> tuple[Any, dict[str, Any]]:
    """What a warm parity does besides checking: load goldens, load the model, run every scenario twice."""
    started = time.perf_counter()
    goldens = session.goldens(profile)
    golden_s = time.perf_counter() - started
    started = time.perf_counter()
    runner = session.runner(profile)
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    for scenario in profile.active_scenarios(device_facts().backend):
        spec = profile.scenario_spec(scenario)
        runner.run(spec)
        runner.run(spec, forced=goldens[scenario.id].record)
    forward_s = time.perf_counter() - started
    times = {"golden_load_s": golden_s, "model_load_s": load_s, "intree_forward_s": forward_s}
    return runner, times | {"scenarios": len(profile.active_scenarios(device_facts().backend))}


def per_step_overhead(session: Any, profile: Profile) -> dict[str, Any]:
    """The harness's own work per step against the in-tree forward it judges, scenario by scenario.

    forward = one free-running in-tree run (the runner's bookkeeping included: logits copied to
    the host, record built); judging = every check of the scenario on that record, against the
    golden as stored (compact: hashes) and against its full vectors (the diagnostic path).
    """
    from harness.checks import registry
    from harness.goldens.specs import runnable_spec

    runner = session.runner(profile)
    rows, totals = [], {"forward_s": 0.0, "judge_s": 0.0, "judge_full_s": 0.0, "steps": 0}
    for scenario in profile.active_scenarios(device_facts().backend):
        if "nightly" in scenario.tags:
            continue
        try:
            golden = session.golden(profile, scenario).record
        except OracleError as e:  # e.g. a composition this backend's oracle cannot run
            print(f"{scenario.id}: skipped, no golden here ({e})", file=sys.stderr)
            continue
        full = session.full_golden(profile, scenario)
        spec = runnable_spec(profile.scenario_spec(scenario))
        started = time.perf_counter()
        record = runner.run(spec)
        forward = time.perf_counter() - started
        checks = [c for c in profile.checks(scenario) if registry.get(c).run == "free"]
        started = time.perf_counter()
        for check in checks:
            registry.judge_pair(check, golden, record, lambda f=full: f)
        judge = time.perf_counter() - started
        started = time.perf_counter()
        for check in checks:
            registry.judge_pair(check, full, record, lambda f=full: f)
        judge_full = time.perf_counter() - started
        steps = len(record.tokens)
        rows.append(
            {
                "scenario": scenario.id,
                "steps": steps,
                "checks": len(checks),
                "forward_ms_per_step": 1e3 * forward / steps,
                "judge_ms_per_step": 1e3 * judge / steps,
                "judge_full_ms_per_step": 1e3 * judge_full / steps,
                "judge_pct_of_forward": 100 * judge / forward,
                "judge_full_pct_of_forward": 100 * judge_full / forward,
            }
        )
        for key, value in (("forward_s", forward), ("judge_s", judge), ("judge_full_s", judge_full), ("steps", steps)):
            totals[key] += value
    totals["judge_pct_of_forward"] = 100 * totals["judge_s"] / totals["forward_s"]
    totals["judge_full_pct_of_forward"] = 100 * totals["judge_full_s"] / totals["forward_s"]
    return {"scenarios": rows, "total": totals}


def parity_wall(model: str) -> dict[str, Any]:
    """Wall time of `python -m harness parity` as `make parity` runs it (report to a temporary file)."""
    with tempfile.TemporaryDirectory(prefix="bench-", dir=scratch_dir()) as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "harness", "parity", "--model", model, "--report", str(report)]
        started = time.perf_counter()
        run_command(cmd, env=settings.environment(), cwd=REPO_ROOT)
        wall = time.perf_counter() - started
        report_data = json.loads(report.read_text())
    # The report's per-check seconds were measured inside that very run (the first check of a scenario
    # and mode includes its in-tree run): a cross-check that other load on the CPU cannot skew.
    checks_s = sum(r["seconds"] for r in report_data["results"])
    return {"parity_wall_s": wall, "parity_verdict": report_data["verdict"], "parity_checks_s": checks_s}


def oracle_generation(profile: Profile, model_dir: Path) -> float:
    """One full oracle generation of all scenarios: what a cold parity adds (nothing is written)."""
    from harness.goldens.specs import runnable_spec
    from harness.runners.oracle import OracleRunner

    scenarios = profile.active_scenarios(device_facts().backend)
    specs = [runnable_spec(profile.scenario_spec(s)) for s in scenarios if profile.oracle_of(s) == profile.oracle]
    started = time.perf_counter()
    OracleRunner(profile.oracle).run(model_dir, specs)
    return time.perf_counter() - started


# -- 3. machine, plumbing, output ---------------------------------------------------------------


def table(result: dict[str, Any]) -> str:
    """The figures as markdown (also what docs/benchmarks.md shows)."""
    s, h, m = result["speed"], result["harness"], result["machine"]
    blas = s.get("intree_openblas")
    lines = [
        f"Prompt: {result['prompt']['scenario']} ({result['prompt']['tokens']} tokens), "
        f"{result['steps']} greedy decode steps, median of {result['repeats']} interleaved rounds.",
        "",
        "| tok/s | in-tree | mlx-lm | in-tree + OpenBLAS |",
        "|---|---:|---:|---:|",
    ]
    for key, label in (
        ("prefill_tok_s", "prefill"),
        ("decode_tok_s", "decode"),
        ("peak_memory_gb", "peak memory (GB)"),
    ):
        extra = f"{blas[key]:.2f}" if blas else "not measured"
        lines.append(f"| {label} | {s['intree'][key]:.2f} | {s['mlx_lm'][key]:.2f} | {extra} |")
    if not h:  # --speed: no parity timings
        lines += ["", machine_line(m)]
        return "\n".join(lines)
    wall = h["parity_wall_s"]
    lines += ["", f"| warm `parity` ({h['parity_verdict']}) | s | % of wall |", "|---|---:|---:|"]
    for key, label in (
        ("parity_wall_s", "total wall"),
        ("intree_forward_s", f"in-tree forward ({h['scenarios']} scenarios x free + teacher-forced)"),
        ("model_load_s", "model load"),
        ("golden_load_s", "golden loading (part of overhead)"),
        ("overhead_s", "harness overhead = wall - forward - model load"),
    ):
        lines.append(f"| {label} | {h[key]:.2f} | {100 * h[key] / wall:.1f} |")
    lines.append(
        f"| same run, from its report: time inside checks | {h['parity_checks_s']:.2f} | "
        f"{100 * h['parity_checks_s'] / wall:.1f} |"
    )
    outside = wall - h["parity_checks_s"]
    lines.append(
        f"| same run: outside checks (startup, imports, collection, report) | {outside:.2f} | "
        f"{100 * outside / wall:.1f} |"
    )
    lines.append(f"| cold: oracle generation, all scenarios (not in a warm run) | {h['oracle_generation_s']:.2f} | |")
    lines += ["", machine_line(m)]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:

    from harness.session import ParitySession

    session = ParitySession()
    profile = session.profile(args.model)
    if args.per_step:
        out = per_step_overhead(session, profile)
        for row in out["scenarios"]:
            print(
                f"{row['scenario']:28} {row['steps']:4} steps {row['checks']} checks  forward "
                f"{row['forward_ms_per_step']:9.2f} ms/step  judging {row['judge_ms_per_step']:7.3f} ms/step "
                f"({row['judge_pct_of_forward']:.2f} %)  full-vector judging {row['judge_full_ms_per_step']:7.3f} "
                f"ms/step ({row['judge_full_pct_of_forward']:.2f} %)"
            )
        total = out["total"]
        print(
            f"total: judging {total['judge_pct_of_forward']:.2f} % of the in-tree forward time "
            f"(full vectors: {total['judge_full_pct_of_forward']:.2f} %) over {total['steps']} steps"
        )
        return 0
    model_dir = session.artifact(profile).model_dir
    if args.speed_only:
        job = json.loads(args.speed_only.read_text())
        runs = intree_runs(session.runner(profile).model, job["prompt_ids"], job["steps"], job["repeats"])
        timings = {
            "prefill_s": [r[0] for r in runs],
            "decode_s": [r[1] for r in runs],
            "peak_bytes": [r[2] for r in runs],
        }
        print(json.dumps(timings | {"blas": device_facts().blas}))
        return 0

    load_before = loadavg()
    harness: dict[str, Any] = {}
    if args.speed:
        runner = session.runner(profile)
    else:
        with progress.task("bench: in-tree work of a parity (goldens, model load, scenarios x 2 modes)"):
            runner, harness = intree_parity_work(session, profile)
        with progress.task("bench: warm parity subprocess"):
            harness |= parity_wall(args.model)
    scenario, ids = bench_prompt(profile, runner)
    with progress.task(f"bench: speed, {args.repeats} rounds of in-tree / mlx-lm / in-tree + OpenBLAS"):
        speeds = speed(profile, model_dir, runner.model, ids, args.steps, args.repeats)
    if not args.speed:
        with progress.task("bench: cold oracle generation"):
            harness["oracle_generation_s"] = oracle_generation(profile, model_dir)
        harness["overhead_s"] = harness["parity_wall_s"] - harness["intree_forward_s"] - harness["model_load_s"]

    result = speed_result(profile.name, args.steps, args.repeats, scenario, ids, speeds, load_before)
    result["harness"] = harness
    print(table(result))
    write_result(result, profile.name, args.out)
    return 0
