"""Vectors, arrays and JSON compared bit for bit, with every failure explained.

Bit-exact means equal raw bits of the full vector (so -0.0 != +0.0 and NaN payloads count),
never allclose. When vectors differ the explanation carries the statistics a person needs
to act: how many elements differ, max abs / rel difference, max ULP distance, the first
differing index with both values, and each side's top-5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from harness.errors import NothingComparedError
from harness.records import ScenarioRecord


def raw_bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).view(f"u{x.dtype.itemsize}")


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in units in the last place between float32 arrays (0 iff same bits, for non-NaN).

    Bits are mapped to integers that are ordered like the floats (negative floats mirrored),
    so the difference counts the representable floats between the two values.
    """
    ia = a.astype(np.float32).view(np.int32).astype(np.int64)
    ib = b.astype(np.float32).view(np.int32).astype(np.int64)
    int_min = np.int64(np.iinfo(np.int32).min)
    oa = np.where(ia < 0, int_min - ia, ia)
    ob = np.where(ib < 0, int_min - ib, ib)
    return np.abs(oa - ob)


# ULP distance buckets of every compared element: 0, 1, 2-3, 4-7, ... (powers of two), >= 2^20.
ULP_BUCKETS = ["0", "1"] + [f"{1 << k}-{(1 << (k + 1)) - 1}" for k in range(1, 20)] + [">=1048576"]


def ulp_histogram(expected: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Counts of elements per ULP_BUCKETS bucket (bucket index = bit length of the distance)."""
    distance = ulp_distance(expected, actual)
    index = np.minimum(
        np.floor(np.log2(np.maximum(distance, 1))).astype(np.int64) + (distance > 0), len(ULP_BUCKETS) - 1
    )
    return np.bincount(index, minlength=len(ULP_BUCKETS))


def top_k(x: np.ndarray, k: int = 5) -> list[tuple[int, float]]:
    idx = np.argsort(-x, kind="stable")[:k]
    return [(int(i), float(x[i])) for i in idx]


@dataclass
class VectorDiff:
    """How two vectors differ; `equal` is the verdict (raw bits of the full vector)."""

    equal: bool
    n_elements: int
    n_differing: int = 0
    max_abs_diff: float = 0.0
    max_rel_diff: float = 0.0
    max_ulp: int = 0
    first_index: int | None = None
    expected_value: float | None = None
    actual_value: float | None = None
    expected_top5: list[tuple[int, float]] = field(default_factory=list)
    actual_top5: list[tuple[int, float]] = field(default_factory=list)
    shape_mismatch: str | None = None
    expected_range: float | None = None  # max - min of the oracle's finite values: the scale of |diff|

    def explain(self, logits: bool = True) -> str:
        """`logits=False` for a tensor that is not a logits row (a log-mel, an encoder output):
        no top-5, which means nothing over a flattened tensor."""
        if self.shape_mismatch:
            return self.shape_mismatch
        if self.equal:
            return f"all {self.n_elements} elements bit-identical"
        top = f"; oracle top-5 {fmt_top(self.expected_top5)}; in-tree top-5 {fmt_top(self.actual_top5)}"
        return (
            f"{self.n_differing}/{self.n_elements} elements differ; max |diff| {self.max_abs_diff:.6g}, "
            f"max rel {self.max_rel_diff:.3g}, max ULP {self.max_ulp}; first at index {self.first_index}: "
            f"oracle {self.expected_value!r} vs in-tree {self.actual_value!r}" + (top if logits else "")
        )


def agreement(expected: np.ndarray, actual: np.ndarray, diff: VectorDiff) -> dict[str, Any]:
    """KL(p_oracle || p_in-tree) in float64 and whether the top-1 agrees, for one logits row:
    what a differing step means for sampling (0 and True for an identical row)."""
    if diff.equal:
        return {"kl": 0.0, "top1": True}
    if diff.shape_mismatch:
        return {}
    e, a = expected.astype(np.float64).reshape(-1), actual.astype(np.float64).reshape(-1)
    finite = np.isfinite(e) & np.isfinite(a)
    if not finite.any():
        return {"kl": None, "top1": bool(np.argmax(e) == np.argmax(a))}
    e, a = e[finite], a[finite]
    log_p = e - (e.max() + np.log(np.exp(e - e.max()).sum()))
    log_q = a - (a.max() + np.log(np.exp(a - a.max()).sum()))
    kl = float(np.sum(np.exp(log_p) * (log_p - log_q)))
    return {"kl": max(kl, 0.0), "top1": bool(np.argmax(e) == np.argmax(a))}


def logit_range(row: np.ndarray) -> float | None:
    """max - min of a row's finite values (the oracle's): the scale a logit difference is read
    against (the sign-off plots max |diff| relative to it); None when no value is finite."""
    finite = row[np.isfinite(row)]
    return float(np.float64(finite.max()) - np.float64(finite.min())) if finite.size else None


def fmt_top(top: list[tuple[int, float]]) -> str:
    return "[" + ", ".join(f"{i}:{v:.5g}" for i, v in top) + "]"


def diff_vectors(expected: np.ndarray, actual: np.ndarray) -> VectorDiff:
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        return VectorDiff(
            equal=False,
            n_elements=int(expected.size),
            shape_mismatch=(
                f"wrong tensor: oracle {expected.shape} {expected.dtype} vs in-tree {actual.shape} {actual.dtype}"
            ),
        )
    differs = raw_bits(expected) != raw_bits(actual)
    n = int(differs.sum())
    if n == 0:
        return VectorDiff(equal=True, n_elements=int(expected.size))
    e64, a64 = expected.astype(np.float64), actual.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        abs_diff = np.abs(e64 - a64)
        rel_diff = abs_diff / np.maximum(np.abs(e64), np.finfo(np.float32).tiny)
    first = int(np.argmax(differs))
    return VectorDiff(
        equal=False,
        n_elements=int(expected.size),
        n_differing=n,
        max_abs_diff=float(np.nanmax(abs_diff[differs])),  # n > 0 here
        max_rel_diff=float(np.nanmax(rel_diff[differs])),
        max_ulp=int(ulp_distance(expected[differs], actual[differs]).max()),
        first_index=first,
        expected_value=float(expected[first]),
        actual_value=float(actual[first]),
        expected_top5=top_k(expected),
        actual_top5=top_k(actual),
        expected_range=logit_range(expected),
    )


@dataclass
class CheckResult:
    """A gate's verdict with its explanation; `first_bad_step` is None when it passed."""

    check: str
    passed: bool
    summary: str
    first_bad_step: int | None = None
    steps_compared: int = 0
    steps_differing: int = 0
    details: dict[str, Any] = field(default_factory=dict)
    # Per step: max |diff|, max ULP, elements differing, the oracle row's logit range, KL, top-1.
    per_step: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_steps(check: str, golden: ScenarioRecord, actual: ScenarioRecord, steps: Sequence[int]) -> CheckResult:
    """Compare logits rows `steps` bit for bit; report the first bad step in full."""
    per_step = []
    first: tuple[int, VectorDiff] | None = None
    n_bad = 0
    steps = list(steps)
    if not steps:
        raise NothingComparedError(f"{check}: nothing to compare: the golden has no logits rows for it")
    if actual.logits.shape[0] != golden.logits.shape[0]:  # a longer trajectory is as wrong as a shorter one
        return _compare_unequal_lengths(check, golden, actual, steps)
    histogram = np.zeros(len(ULP_BUCKETS), dtype=np.int64)
    for step in steps:
        diff = diff_vectors(golden.logits[step], actual.logits[step])
        per_step.append(
            {"step": step, "max_abs_diff": diff.max_abs_diff, "max_ulp": diff.max_ulp, "n_differing": diff.n_differing}
            | {"logit_range": logit_range(golden.logits[step])}
            | agreement(golden.logits[step], actual.logits[step], diff)
        )
        if not diff.equal and not diff.shape_mismatch:
            histogram += ulp_histogram(golden.logits[step], actual.logits[step])
        else:
            histogram[0] += golden.logits[step].size
        if not diff.equal:
            n_bad += 1
            if first is None:
                first = (step, diff)
            if diff.shape_mismatch:
                break
    buckets = {"ulp_histogram": dict(zip(ULP_BUCKETS, histogram.tolist(), strict=True))}
    if first is None:
        return CheckResult(
            check,
            True,
            f"{len(steps)} steps bit-identical",
            steps_compared=len(steps),
            per_step=per_step,
            details=buckets,
        )
    step, diff = first
    return CheckResult(
        check,
        False,
        f"first differing step {step}{where(golden, step)} ({n_bad}/{len(steps)} steps differ): {diff.explain()}",
        first_bad_step=step,
        steps_compared=len(steps),
        steps_differing=n_bad,
        details={"first_step_diff": asdict(diff), "row_label": where(golden, step)} | buckets,
        per_step=per_step,
    )


def _compare_unequal_lengths(
    check: str, golden: ScenarioRecord, actual: ScenarioRecord, steps: list[int]
) -> CheckResult:
    """Rows of unequal count always fail; the rows both sides made say where the runs parted.

    A row that differs among them is the failure to explain (and to localize): the trajectory
    left the oracle's there, and its length differs as a consequence. When every shared row is
    bit-identical, the model computed the same thing and the runs differ only in where they
    stopped: the first row one side lacks is named, and there is no module to localize.
    """
    n_golden, n_actual = golden.logits.shape[0], actual.logits.shape[0]
    lengths = f"wrong tensor: in-tree produced {n_actual} logits rows, the oracle {n_golden}"
    end = min(n_golden, n_actual)
    shared = [s for s in steps if s < end]
    result = None
    if shared:
        result = compare_steps(
            check, replace(golden, logits=golden.logits[:end]), replace(actual, logits=actual.logits[:end]), shared
        )
    rows = {"oracle": n_golden, "in_tree": n_actual}
    if result is not None and not result.passed:
        result.summary = f"{lengths}; {result.summary}"
        result.details["rows"] = rows
        return result
    return CheckResult(
        check,
        False,
        f"{lengths}; the {len(shared)} judged rows both made are bit-identical: the runs part at row {end}, "
        f"where the {'oracle' if n_golden < n_actual else 'in-tree run'} stopped and the other went on",
        first_bad_step=end,
        steps_compared=len(shared),
        details={"rows": rows, "shared_rows_identical": True},
        per_step=result.per_step if result is not None else [],
    )


def compare_array(check: str, golden: ScenarioRecord, actual: ScenarioRecord, name: str) -> CheckResult:
    """A named tensor (a log-mel, stacked encoder outputs) bit for bit; the first axis is explained.

    For stacked arrays (3-D) each leading index is one segment: the first differing one is
    reported in full, the others counted.
    """
    if name not in golden.arrays:
        return CheckResult(check, False, f"the golden has no {name!r} tensor (it has {sorted(golden.arrays)})")
    if name not in actual.arrays:
        return CheckResult(check, False, f"wrong tensors: the in-tree record has no {name!r} tensor")
    expected, got = golden.arrays[name], actual.arrays[name]
    if expected.shape != got.shape or expected.dtype != got.dtype:
        return CheckResult(check, False, diff_vectors(expected, got).explain() + _shared_rows(expected, got))
    parts = [expected] if expected.ndim < 3 else list(expected)
    mine = [got] if got.ndim < 3 else list(got)
    bad = [
        i for i, (e, a) in enumerate(zip(parts, mine, strict=True)) if raw_bits(e).tobytes() != raw_bits(a).tobytes()
    ]
    what = f"{name} {'x'.join(map(str, expected.shape))} {expected.dtype}"
    if not bad:
        return CheckResult(check, True, f"{what}: bit-identical", steps_compared=len(parts))
    first = bad[0]
    diff = diff_vectors(parts[first].reshape(-1), mine[first].reshape(-1))
    where = f" (index {first} of the first axis: {len(bad)}/{len(parts)} differ)" if expected.ndim >= 3 else ""
    return CheckResult(
        check,
        False,
        f"{what} differs{where}: {diff.explain(logits=False)}",
        first_bad_step=first,
        steps_compared=len(parts),
        steps_differing=len(bad),
        details={"first_diff": asdict(diff)},
    )


def _shared_rows(expected: np.ndarray, got: np.ndarray) -> str:
    """For tensors that differ only in their first axis's length (a log-mel of 3582 frames against
    3000): the rows both have, compared bit for bit (how many differ, the first, the one with the
    largest |Δ| and its values), and what the longer side's extra rows hold. Empty otherwise."""
    if expected.dtype != got.dtype or expected.ndim == 0 or expected.shape[1:] != got.shape[1:]:
        return ""
    n = min(expected.shape[0], got.shape[0])
    if n == 0:
        return ""
    same = (raw_bits(expected[:n]).reshape(n, -1) == raw_bits(got[:n]).reshape(n, -1)).all(axis=1)
    text = f"; the first {n} rows, which both have, "
    if same.all():
        text += "are bit-identical"
    else:
        e, a = (x[:n].reshape(n, -1).astype(np.float64) for x in (expected, got))
        delta = np.nan_to_num(np.abs(e - a), nan=np.inf).max(axis=1)
        first, worst = int(np.argmin(same)), int(np.argmax(delta))
        text += (
            f"differ in {int((~same).sum())}: first row {first} (max |Δ| {delta[first]:.3g}), largest |Δ| "
            f"{delta[worst]:.3g} at row {worst}: oracle {_row_values(e[worst])} vs in-tree {_row_values(a[worst])}"
        )
    side, longer = ("in-tree", got) if got.shape[0] > n else ("oracle", expected)
    return text + f"; the {side}'s {longer.shape[0] - n} rows past them hold {_row_values(longer[n:].reshape(-1))}"


def _row_values(values: np.ndarray) -> str:
    values = np.asarray(values, dtype=np.float64)
    if not values.size:
        return "no values"
    if np.all(values == values[0]):
        return f"{values[0]:.4g} throughout"
    return f"values from {np.nanmin(values):.4g} to {np.nanmax(values):.4g}"


def first_json_difference(expected: Any, actual: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """The first key path where two JSON values differ (floats by exact value, so bits), or None."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual)):
            if key not in expected or key not in actual:
                return f"{path}.{key}", expected.get(key, "<absent>"), actual.get(key, "<absent>")
            found = first_json_difference(expected[key], actual[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        for i, (e, a) in enumerate(zip(expected, actual, strict=False)):
            found = first_json_difference(e, a, f"{path}[{i}]")
            if found:
                return found
        if len(expected) != len(actual):
            return f"{path} (length)", len(expected), len(actual)
        return None
    if type(expected) is float and type(actual) is float and math.isnan(expected) and math.isnan(actual):
        return None  # both sides computed NaN there (e.g. an fp16 log-prob sum): the same result
    if type(expected) is not type(actual) or expected != actual:
        return path or "(value)", expected, actual
    return None


def compare_json(check: str, what: str, expected: Any, actual: Any, *, allow_empty: bool = False) -> CheckResult:
    """Two JSON-shaped results (a transcript, fallback decisions, drafting stats) must be
    identical. A golden with nothing in it (None, or an empty list or object) is nothing to
    compare, an error, unless the caller says an empty value is a result (`allow_empty`)."""
    if not allow_empty and (expected is None or expected == [] or expected == {}):
        raise NothingComparedError(f"{check}: nothing to compare: the golden has no {what} ({expected!r})")
    found = first_json_difference(expected, actual)
    if found is None:
        return CheckResult(check, True, f"{what} identical")
    path, e, a = found
    return CheckResult(
        check,
        False,
        f"{what} differs at {path.lstrip('.')}: oracle {e!r} vs in-tree {a!r}",
        details={"path": path, "oracle": e, "intree": a},
    )


def where(record: ScenarioRecord, row: int) -> str:
    """` (turn 1 step 3)` for a multi-segment record; nothing for a plain one."""
    segments = record.segments()
    if len(segments) == 1 and segments[0].batch == 1 and not segments[0].label:
        return ""
    return f" ({record.describe_row(row)})"
