"""`python -m harness bench-kv --model NAME`: KV cache memory and speed, L1 against L2, in-tree against the oracles.

For every KV configuration (harness.tools.bench_kv_configs: plain KV, KV8, KV4 at L1;
mixed-precision, streaming conversion, rotating quantized at L2) and every context length,
a cell: the in-tree side (harness.tools.bench_kv_worker) and the oracle's
(oracles/<oracle>/bench_kv.py: mlx-lm for L1, mlx-optiq for L2), each a process of its own, so
that every configuration's peak memory is its own. Each loads the model, warms up on a short
prompt, then `--rounds` paired rounds time both sides back to back (harness.tools.bench_paired;
the order alternates by round). A run prefills the context (the profile's longest scenario
prompt, repeated to the length) and takes `--steps` greedy decode steps on a fresh cache.

Per side and cell: prefill and decode tok/s (best-of / median over the rounds), the run's mx
peak memory (weights included; the weights alone are what is active before the run), the
process's peak RSS, and the final cache's stored bytes against the theoretical figure, per
token held and per token fed.

Prefill is quadratic in the context and this project's CPU runs the reference BLAS, so the
run has a wall-clock budget (`--budget-s`): before each cell its cost is estimated from the
cells already run (harness.tools.bench_kv_budget); a cell that would overrun is run without
its oracle side if that fits, and is otherwise recorded as not run, with the estimate, never
silently left out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import settings
from harness.errors import HarnessError, UsageError
from harness.fileio import atomic_write_bytes
from harness.progress import progress
from harness.tools.bench_common import bench_prompt, loadavg, machine, scratch_dir, write_result
from harness.tools.bench_kv_budget import alone_s, plan_cell
from harness.tools.bench_kv_configs import (
    DEFAULT_CONFIGS,
    KVConfig,
    configs,
    parse_configs,
    theoretical_kv_bytes,
)
from harness.tools.bench_paired import Worker, ratio_stats, ready_and_paired, side_stats

DEFAULT_CONTEXTS = (1024, 4096, 8192)
WARMUP_TOKENS, WARMUP_STEPS = 64, 4
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def context_prompt(ids: list[int], context: int) -> list[int]:
    """`ids` repeated (and cut) to exactly `context` tokens."""
    if not ids:
        raise HarnessError("bench-kv: the bench prompt has no tokens")
    return (ids * (context // len(ids) + 1))[:context]


def workers(config: KVConfig, model_dir: Path, job: Path, oracle: bool) -> list[Worker]:
    root = Path(__file__).resolve().parents[2]
    intree = [sys.executable, "-m", "harness", "bench-kv-worker", "--model-dir", str(model_dir), "--job", str(job)]
    sides = [Worker("in-tree", intree, settings.environment(), root)]
    if oracle:
        sides.append(Worker.oracle(config.oracle, config.oracle, "bench_kv.py", job, model_dir))
    return sides


def kv_figures(config: KVConfig, run: dict[str, Any], shape: dict[str, int]) -> dict[str, Any]:
    """The final cache's measured bytes next to the theoretical ones (per held and per fed token)."""
    kv = run["kv"]
    dtype = (kv["dtype"] or "").removeprefix("mlx.core.")
    if dtype not in DTYPE_BYTES:
        raise HarnessError(f"bench-kv: cache dtype {kv['dtype']!r} is none of {sorted(DTYPE_BYTES)}")
    theory = theoretical_kv_bytes(
        config, kv["offset"], shape["layers"], shape["kv_heads"], shape["head_dim"], DTYPE_BYTES[dtype]
    )
    return {
        "bytes": kv["nbytes"],
        "tokens_fed": kv["offset"],
        "tokens_held": kv["tokens_held"],
        "per_held_token": kv["nbytes"] / kv["tokens_held"],
        "per_context_token": kv["nbytes"] / kv["offset"],
        "cache_types": kv["types"],
        "dtype": dtype,
        "theoretical": theory,
        "measured_over_theoretical": kv["nbytes"] / theory["bytes"],
    }


def side_summary(
    config: KVConfig, ready: dict[str, Any], runs: list[dict[str, Any]], steps: int, context: int, shape: dict[str, int]
) -> dict[str, Any]:
    summary = side_stats(runs, steps, context)
    summary |= {
        "peak_mb": max(r["peak_bytes"] for r in runs) / 1e6,
        "weights_mb": min(r["active_before_bytes"] for r in runs) / 1e6,
        "rss_peak_mb": max(r["rss_peak_bytes"] for r in runs) / 1e6,
        "kv": kv_figures(config, runs[-1], shape),
        "tokens": runs[-1]["tokens"],
        "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs],
        "environment": {k: v for k, v in ready.items() if k not in ("status", "warmup")},
    }
    summary["peak_over_weights_mb"] = summary["peak_mb"] - summary["weights_mb"]
    return summary


def run_cell(
    config: KVConfig, context: int, rounds: int, oracle: bool, setup: dict[str, Any], shape: dict[str, int]
) -> dict[str, Any]:
    """Both sides of one (configuration, context) cell: warm-ups, then `rounds` paired rounds."""
    steps = setup["steps"]
    job = {
        "config": config.job(context, steps),
        "prompt_ids": context_prompt(setup["ids"], context),
        "steps": steps,
        "warmup_ids": setup["ids"][:WARMUP_TOKENS],
        "warmup_steps": WARMUP_STEPS,
        "prefill_step_size": setup["prefill_step_size"],
    }
    load_before = loadavg()[0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-kv-", dir=scratch_dir()) as tmp:
        path = Path(tmp) / "job.json"
        path.write_text(json.dumps(job))
        sides = workers(config, setup["model_dir"], path, oracle)
        ready, runs = ready_and_paired(sides, rounds)
    cell: dict[str, Any] = {
        "config": config.name,
        "context": context,
        "rounds": rounds,
        "sides": {name: side_summary(config, ready[name], rs, steps, context, shape) for name, rs in runs.items()},
        "wall_s": time.perf_counter() - started,
        "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "loadavg_1m_before_after": [load_before, loadavg()[0]],
    }
    if oracle:
        a, b = cell["sides"]["in-tree"], cell["sides"][config.oracle]
        cell["ratio_in_tree_over_oracle"] = ratio_stats(a, b)
        cell["same_tokens"] = a["tokens"] == b["tokens"]
        # Both sides must have built the same caches, or the comparison compares nothing alike.
        cell["same_cache_classes"] = a["kv"]["cache_types"] == b["kv"]["cache_types"]
    return cell


def bench(
    kv_configs: list[KVConfig],
    contexts: list[int],
    rounds: list[int],
    oracle: bool,
    budget_s: float,
    setup: dict[str, Any],
    shape: dict[str, int],
    prior: dict[tuple[str, int], dict[str, Any]],
) -> list[dict[str, Any]]:
    """Every cell, shortest context first; one measured in `prior` (--resume) is kept as it is;
    a cell that fails or would overrun is recorded as such."""
    started = time.perf_counter()
    chunk = setup["prefill_step_size"]
    plan = [(context, n, config) for context, n in zip(contexts, rounds, strict=True) for config in kv_configs]
    cells: list[dict[str, Any]] = []
    for i, (context, n_rounds, config) in enumerate(plan):
        if (config.name, context) in prior:
            cells.append(prior[config.name, context])
            continue
        left = budget_s - (time.perf_counter() - started)
        later = [(c, n, r) for n, r, c in plan[i + 1 :] if (c.name, n) not in prior]
        reserve = sum(alone_s(c, n, r, chunk, cells) for c, n, r in later)
        with_oracle, notes = plan_cell(config, context, n_rounds, oracle, left, budget_s, chunk, cells, reserve)
        head = {"config": config.name, "context": context, "rounds": n_rounds, **notes}
        if "not_run" in notes:
            print(f"bench-kv: {config.name} at {context} tokens: not run ({notes['not_run']})", file=sys.stderr)
            cells.append(head)
            continue
        label = f"{config.name} at {context} tokens" + (f" vs {config.oracle}" if with_oracle else "")
        try:
            with progress.task(f"bench-kv: {label}, {n_rounds} round(s)"):
                cells.append(run_cell(config, context, n_rounds, with_oracle, setup, shape) | head)
        except HarnessError as e:  # one side died: the other cells still count
            print(f"bench-kv: {label}: failed: {e}", file=sys.stderr)
            cells.append(head | {"failed": str(e)})
    return cells


def load_prior(
    path: Path, expected: dict[str, Any]
) -> tuple[dict[tuple[str, int], dict[str, Any]], list[dict[str, Any]]]:
    """The measured cells of an earlier result (--resume), by (configuration, context), and the
    sessions they come from (that run's, then those it resumed); it must have measured the same
    thing (model, steps, prefill chunk, shape)."""
    try:
        raw = json.loads(path.read_text())
        cells = raw["cells"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise HarnessError(f"--resume {path}: expected a bench-kv result JSON ({e})") from None
    for key, value in expected.items():
        if raw.get(key) != value:
            raise HarnessError(f"--resume {path}: its {key} is {raw.get(key)!r}, this run's is {value!r}")
    # A cell keeps the session it was measured in, through any number of resumptions.
    kept = {(c["config"], c["context"]): {"resumed_from": str(path)} | c for c in cells if c.get("sides")}
    earlier = raw.get("resumed") or []
    earlier = [earlier] if isinstance(earlier, dict) else earlier
    return kept, [{"path": str(path), "machine": raw.get("machine"), "command": raw.get("command")}, *earlier]


def _int_list(flag: str, text: str, minimum: int) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise HarnessError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not values or any(v < minimum for v in values):
        raise HarnessError(f"{flag}: expected comma-separated integers >= {minimum}, got {text!r}")
    return values


def checked(args: argparse.Namespace) -> tuple[list[str], list[int], list[int]]:
    """Configuration names, contexts and rounds, checked before anything loads."""
    try:
        names = [c.name for c in parse_configs(args.configs or ",".join(DEFAULT_CONFIGS), n_layers=2)]
        contexts = _int_list("--contexts", args.contexts or ",".join(map(str, DEFAULT_CONTEXTS)), WARMUP_TOKENS + 1)
        rounds = _int_list("--rounds", args.rounds, minimum=1)
    except HarnessError as e:
        raise UsageError(str(e)) from None
    if len(rounds) == 1:
        rounds = rounds * len(contexts)
    if len(rounds) != len(contexts):
        raise UsageError(f"--rounds: expected one number or one per context ({len(contexts)}), got {args.rounds!r}")
    if args.steps < 1 or args.prefill_step_size < 1 or args.budget_s <= 0:
        raise UsageError("--steps, --prefill-step-size and --budget-s: need positive values")
    return names, contexts, rounds


def run(args: argparse.Namespace) -> int:
    names, contexts, rounds = checked(args)
    return measure(args, names, contexts, rounds, args.argv)


def measure(args: argparse.Namespace, names: list[str], contexts: list[int], rounds: list[int], argv: list[str]) -> int:
    from harness.session import ParitySession
    from harness.tools.bench_kv_report import plot_png, table
    from models.universal.config import LlamaConfig, read_config_json

    session = ParitySession()
    profile = session.profile(args.model)
    model_dir = session.artifact(profile).model_dir
    config = LlamaConfig.from_dict(read_config_json(model_dir))
    shape = {"layers": config.num_hidden_layers, "kv_heads": config.n_kv_heads, "head_dim": config.attention_head_dim}
    known = configs(shape["layers"])
    scenario, ids = bench_prompt(profile, session.runner(profile))
    setup = {"model_dir": model_dir, "ids": ids, "steps": args.steps, "prefill_step_size": args.prefill_step_size}
    same = {"model": profile.name, "steps": args.steps, "prefill_step_size": args.prefill_step_size, "shape": shape}
    prior: dict[tuple[str, int], dict[str, Any]] = {}
    resumed: list[dict[str, Any]] = []
    for path in args.resume:
        cells_there, sessions = load_prior(path, same)
        prior = cells_there | prior  # an earlier --resume's cell wins
        resumed += sessions
    load_before = loadavg()
    kv_configs = [known[n] for n in names]
    cells = bench(kv_configs, contexts, rounds, not args.no_oracle, args.budget_s, setup, shape, prior)
    # --configs orders the runs (what the budget reaches first); the result lists them in the
    # catalogue's order, whatever order they ran in, so tables of several sessions line up.
    in_order = [n for n in known if n in names]
    cells.sort(key=lambda c: (c["context"], in_order.index(c["config"])))
    result = same | {
        "prompt": {"scenario": scenario, "tokens": len(ids), "repeated_to": contexts},
        "budget_s": args.budget_s,
        "resumed": resumed,
        "configs": {n: {"tier": known[n].tier, "oracle": known[n].oracle, "what": known[n].what} for n in in_order},
        "cells": cells,
        "machine": machine(load_before),
        "command": "python -m harness bench-kv " + " ".join(argv),
    }
    out = write_result(result, f"kv-{profile.name}", args.out)
    markdown = table(result)
    atomic_write_bytes(out.with_suffix(".md"), (markdown + "\n").encode())
    plot_path = args.plot or out.with_suffix(".png")
    atomic_write_bytes(plot_path, plot_png(result))
    print(markdown)
    print(f"bench-kv: table {out.with_suffix('.md')}, plot {plot_path}")
    failed = [f"{c['config']} at {c['context']}" for c in cells if "failed" in c]
    if failed:
        print(f"bench-kv: {len(failed)} cell(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
