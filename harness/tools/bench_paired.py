"""Paired, interleaved benchmark rounds over long-lived worker processes, and their statistics.

Every side (in-tree eager, in-tree compiled, mlx-lm) is a process of its own that loads the
model once, runs its warm-up, says `ready` (one JSON line on stdout) and then answers each
`run` line on its stdin with one timed greedy run (one JSON line: prefill_s, decode_s,
peak_bytes). A round asks every side for one run, back to back, so the sides of one round see
the same minutes of a noisy host; the order rotates from round to round so that no side is
always first. Per side we report best-of, median, min..max and the interquartile range; per
round the ratio of two sides' tok/s (paired: the noise common to one round divides out), with
the same figures. The protocol is the whole contract: oracles/<oracle>/bench.py `--serve`
speaks it in the oracle venv, harness.tools.bench_worker for the in-tree sides.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.oracle.process import OracleProcess

ANSWER_KEYS = ("prefill_s", "decode_s", "peak_bytes")


class Worker:
    """One side's process: started, waited for (`ready`), asked for runs, closed."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        env: dict[str, str],
        cwd: Path,
        answer_keys: tuple[str, ...] = ANSWER_KEYS,
        proc: subprocess.Popen[str] | None = None,
    ):
        """An in-tree side: `cmd` in the project's interpreter (or an oracle's `proc`, see `oracle`)."""
        self.name = name
        self.cmd = cmd
        self.answer_keys = answer_keys  # what every `run` answer must hold
        self.proc = proc or subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd
        )
        self.ready: dict[str, Any] = {}

    @classmethod
    def oracle(
        cls, name: str, oracle: str, script: str, job: Path, model_dir: Path, answer_keys: tuple[str, ...] = ANSWER_KEYS
    ) -> Worker:
        """An oracle's side: its `script --serve` (harness/oracle/process.py) on the sides'
        common job file plus the model directory, in a work folder beside that file."""
        work = job.parent / f"oracle-{name}"
        work.mkdir(exist_ok=True)
        orders = json.loads(job.read_text()) | {"model_dir": str(model_dir)}
        proc = OracleProcess(oracle).serve(script, orders, work)
        return cls(name, [str(a) for a in proc.args], {}, work, answer_keys, proc=proc)

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            tail = "\n".join((self.proc.stderr.read() if self.proc.stderr else "").strip().splitlines()[-20:])
            raise HarnessError(
                f"bench worker {self.name!r} ({' '.join(self.cmd[:4])} ...) ended (exit {self.proc.returncode}) "
                f"without answering:\n{tail}"
            )
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            raise HarnessError(
                f"bench worker {self.name!r}: expected one JSON object per line, got {line[:200]!r}"
            ) from None

    def wait_ready(self) -> dict[str, Any]:
        self.ready = self._line()
        if self.ready.get("status") != "ready":
            raise HarnessError(f"bench worker {self.name!r}: expected a 'ready' line first, got {self.ready}")
        return self.ready

    def run(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        answer = self._line()
        missing = set(self.answer_keys) - answer.keys()
        if missing:
            raise HarnessError(f"bench worker {self.name!r}: run answer lacks {sorted(missing)}: {answer}")
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def paired_rounds(workers: list[Worker], rounds: int) -> dict[str, list[dict[str, Any]]]:
    """`rounds` rounds; in round r every worker runs once, starting with worker r mod n."""
    if rounds < 1:
        raise HarnessError(f"rounds: need at least 1, got {rounds}")
    runs: dict[str, list[dict[str, Any]]] = {w.name: [] for w in workers}
    for r in range(rounds):
        for w in workers[r % len(workers) :] + workers[: r % len(workers)]:
            runs[w.name].append(w.run() | {"round": r})
    return runs


def ready_and_paired(
    workers: list[Worker], rounds: int
) -> tuple[dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Every worker's ready line (after its warm-up), then `paired_rounds`; the workers are closed either way."""
    try:
        ready = {w.name: w.wait_ready() for w in workers}
        runs = paired_rounds(workers, rounds)
    finally:
        for w in workers:
            w.close()
    return ready, runs


# A ratio quoted in docs/benchmarks.md comes from at least this many paired rounds, with its IQR.
QUOTABLE_ROUNDS = 15


def quartiles(values: list[float]) -> tuple[float, float]:
    """The 25th and 75th percentiles of `values`, interpolated between the sorted values
    (position p * (n - 1), numpy's default "linear"; statistics' "inclusive" method)."""
    if len(values) == 1:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def spread(values: list[float], lower_is_better: bool = False) -> dict[str, Any]:
    """best-of (the highest, or the lowest for times), median, min, max and interquartile range
    (`iqr`: [25th, 75th percentile]) of per-round figures."""
    if not values:
        raise HarnessError("spread: no values")
    return {
        "best": min(values) if lower_is_better else max(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "iqr": list(quartiles(values)),
        "values": values,
    }


def side_stats(runs: list[dict[str, Any]], steps: int, prompt_tokens: int) -> dict[str, Any]:
    """Decode tok/s = steps / (last step - step 0); prefill tok/s = prompt tokens / (call to step 0)."""
    return {
        "decode_tok_s": spread([steps / r["decode_s"] for r in runs]),
        "prefill_tok_s": spread([prompt_tokens / r["prefill_s"] for r in runs]),
        "peak_memory_gb": max(r["peak_bytes"] for r in runs) / 1e9,
    }


def ratio_stats(numerator: dict[str, Any], denominator: dict[str, Any]) -> dict[str, Any]:
    """Per-round ratios of two sides' tok/s (round i of one over round i of the other)."""
    return {
        key: spread([a / b for a, b in zip(numerator[key]["values"], denominator[key]["values"], strict=True)])
        for key in ("decode_tok_s", "prefill_tok_s")
    }


def fmt(s: dict[str, Any], unit: str = "") -> str:
    """`best / median, IQR q1..q3 (min..max)` of one spread, for the tables."""
    q1, q3 = s["iqr"]
    return f"{s['best']:.2f}{unit} / {s['median']:.2f}{unit}, IQR {q1:.2f}..{q3:.2f} ({s['min']:.2f}..{s['max']:.2f})"
