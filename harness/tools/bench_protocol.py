"""The cost of the process boundary (issue 33): what the protocol adds to each decode step of an
implementation in its own process, against that implementation's own compute.

Each round is one `run` of a scenario over docs/protocol.md, timed at the harness's side from the
request sent to the record read and checked (`ProcessRunner.run`: the JSON lines, the `.npy` and
`result.json` written and read back, the records validated). The implementation says in its `ran`
answer how long it computed (`compute_s`, optional in the protocol: the reference client reports
the time of its decode loop up to the logits in host memory). The overhead of a round is the
difference, so both figures come from the same run: paired by construction.

    python -m harness bench-protocol --model smollm2-135m-stdio --rounds 15
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from harness.errors import UsageError
from harness.progress import progress
from harness.tools.bench_common import loadavg, machine, write_result
from harness.tools.bench_paired import spread


def timed_runs(runner: Any, spec: dict[str, Any], rounds: int) -> list[dict[str, float]]:
    """One warm-up run (not kept), then `rounds` timed runs of `spec`."""
    runs = []
    for i in range(rounds + 1):
        start = time.perf_counter()
        record = runner.run(spec)
        wall = time.perf_counter() - start
        compute = runner.last_answer.get("compute_s")
        if not isinstance(compute, int | float) or not 0 < compute <= wall:
            raise UsageError(
                f"{runner.plugin.label}'s 'ran' answer has compute_s {compute!r}: expected its own compute "
                f"time in seconds, > 0 and within the {wall:.3f} s the harness measured (docs/protocol.md)"
            )
        if len(record.tokens) != spec["n_tokens"]:
            raise UsageError(f"{spec['id']}: {len(record.tokens)} tokens, expected {spec['n_tokens']}")
        if i:
            runs.append({"wall_s": wall, "compute_s": float(compute), "overhead_s": wall - compute})
    return runs


def summary(runs: list[dict[str, float]], steps: int) -> dict[str, Any]:
    """Per-step figures in ms and the overhead as a fraction of the compute, each with its spread."""
    return {
        "compute_ms_per_step": spread([r["compute_s"] * 1e3 / steps for r in runs], lower_is_better=True),
        "overhead_ms_per_step": spread([r["overhead_s"] * 1e3 / steps for r in runs], lower_is_better=True),
        "overhead_fraction": spread([r["overhead_s"] / r["compute_s"] for r in runs], lower_is_better=True),
    }


def table(result: dict[str, Any]) -> str:
    s = result["summary"]

    def cell(stats: dict[str, Any], scale: float = 1.0, unit: str = "") -> str:
        lo, hi = (v * scale for v in stats["iqr"])
        low, high = stats["min"] * scale, stats["max"] * scale
        return f"{stats['median'] * scale:.2f}{unit} (IQR {lo:.2f}-{hi:.2f}, range {low:.2f}-{high:.2f})"

    return "\n".join(
        [
            f"{result['implementation']} on {result['model']}, scenario {result['scenario']}, "
            f"{result['steps']} steps, {result['rounds']} rounds:",
            f"  compute per step   {cell(s['compute_ms_per_step'], unit=' ms')}",
            f"  protocol per step  {cell(s['overhead_ms_per_step'], unit=' ms')}",
            f"  protocol / compute {cell(s['overhead_fraction'], 100, ' %')}",
        ]
    )


def run(args: argparse.Namespace) -> int:
    from harness.session import ParitySession

    if args.rounds < 1 or args.steps < 1:
        raise UsageError(f"--rounds and --steps: need at least 1, got {args.rounds} and {args.steps}")
    session = ParitySession()
    profile = session.profile(args.model)
    plugin = profile.under_test.plugin
    if plugin is None:
        raise UsageError(
            f"--model {profile.name}: its implementation is in-tree; expected a profile whose "
            "implementation runs in its own process (profiles/external/)"
        )
    scenario = next((s for s in profile.scenarios if s.kind == "plain" and s.composition is None), None)
    if scenario is None:
        raise UsageError(f"--model {profile.name}: expected a plain scenario to time")
    spec = profile.scenario_spec(scenario) | {"n_tokens": args.steps}
    load_before = loadavg()
    try:
        runner = session.runner(profile)
        with progress.task(f"bench_protocol: {args.rounds} rounds of {scenario.id} in {plugin.label}"):
            runs = timed_runs(runner, spec, args.rounds)
    finally:
        session.release(profile.name)
    result = {
        "model": profile.name,
        "implementation": plugin.label,
        "scenario": scenario.id,
        "steps": args.steps,
        "rounds": args.rounds,
        "runs": runs,
        "summary": summary(runs, args.steps),
        "machine": machine(load_before),
    }
    print(table(result))
    write_result(result, f"protocol-{profile.name}", args.out)
    return 0
