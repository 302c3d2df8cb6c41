"""The one comparison module: judges two records, bit for bit, and explains every failure.

Bit-exact means equal raw bits of the full vector (so -0.0 != +0.0 and NaN payloads count),
never allclose. When vectors differ the explanation carries the statistics a person needs
to act: how many elements differ, max abs / rel difference, max ULP distance, the first
differing index with both values, and each side's top-5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
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

    def explain(self) -> str:
        if self.shape_mismatch:
            return self.shape_mismatch
        if self.equal:
            return f"all {self.n_elements} elements bit-identical"
        return (
            f"{self.n_differing}/{self.n_elements} elements differ; max |diff| {self.max_abs_diff:.6g}, "
            f"max rel {self.max_rel_diff:.3g}, max ULP {self.max_ulp}; first at index {self.first_index}: "
            f"oracle {self.expected_value!r} vs in-tree {self.actual_value!r}; "
            f"oracle top-5 {_fmt_top(self.expected_top5)}; in-tree top-5 {_fmt_top(self.actual_top5)}"
        )


def _fmt_top(top: list[tuple[int, float]]) -> str:
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
        max_abs_diff=float(np.nanmax(abs_diff[differs])) if n else 0.0,
        max_rel_diff=float(np.nanmax(rel_diff[differs])) if n else 0.0,
        max_ulp=int(ulp_distance(expected[differs], actual[differs]).max()),
        first_index=first,
        expected_value=float(expected[first]),
        actual_value=float(actual[first]),
        expected_top5=top_k(expected),
        actual_top5=top_k(actual),
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
    per_step: list[dict[str, Any]] = field(default_factory=list)  # max |diff| and ULP per step

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
        return CheckResult(
            check,
            False,
            f"wrong tensor: in-tree produced {actual.logits.shape[0]} logits rows, the oracle {golden.logits.shape[0]}",
            first_bad_step=min(actual.logits.shape[0], golden.logits.shape[0]),
        )
    histogram = np.zeros(len(ULP_BUCKETS), dtype=np.int64)
    for step in steps:
        diff = diff_vectors(golden.logits[step], actual.logits[step])
        per_step.append(
            {"step": step, "max_abs_diff": diff.max_abs_diff, "max_ulp": diff.max_ulp, "n_differing": diff.n_differing}
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
        f"first differing step {step}{_where(golden, step)} ({n_bad}/{len(steps)} steps differ): {diff.explain()}",
        first_bad_step=step,
        steps_compared=len(steps),
        steps_differing=n_bad,
        details={"first_step_diff": asdict(diff)} | buckets,
        per_step=per_step,
    )


def compare_tokens(check: str, golden: ScenarioRecord, actual: ScenarioRecord) -> CheckResult:
    n = len(golden.tokens)
    if n == 0:
        raise NothingComparedError(f"{check}: nothing to compare: the golden has no tokens")
    for step in range(n):
        got = actual.tokens[step] if step < len(actual.tokens) else None
        if got != golden.tokens[step]:
            top2 = top_k(golden.logits[step], 2)
            margin = top2[0][1] - top2[1][1]
            tie = classify_flip(golden, actual, step)
            return CheckResult(
                check,
                False,
                f"token trajectories diverge at step {step}{_where(golden, step)}: oracle {golden.tokens[step]} "
                f"vs in-tree {got}; "
                f"oracle top-2 margin there {margin:.6g} (top-2 {_fmt_top(top2)}); {tie['explanation']}",
                first_bad_step=step,
                steps_compared=n,
                steps_differing=n - step,
                details={
                    "oracle_token": golden.tokens[step],
                    "intree_token": got,
                    "oracle_top2_margin": margin,
                    "flip": tie,
                },
            )
    if len(actual.tokens) != n:
        return CheckResult(
            check,
            False,
            f"in-tree produced {len(actual.tokens)} tokens, oracle {n}",
            first_bad_step=min(n, len(actual.tokens)),
        )
    return CheckResult(check, True, f"{n} greedy tokens identical", steps_compared=n)


def margin_shift(expected: np.ndarray, actual: np.ndarray, want: int, got: int) -> tuple[float, float]:
    """(the expected side's margin of `want` over `got`, how much the actual side moves it).

    margin = e[want] - e[got] (>= 0 when the expected side preferred `want` on these logits);
    shift = |(a[want] - a[got]) - (e[want] - e[got])|, computed in float64."""
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    margin = float(e[want] - e[got])
    return margin, float(abs((a[want] - a[got]) - margin))


def is_near_tie(margin: float, shift: float) -> bool:
    """THE near-tie rule, for every gate that explains a flip (L1 diagnostics, the fast-path
    gate, calibration): the logit error moves the decisive margin by at least the margin itself.
    A negative or non-finite margin is never a near-tie (a rule, not a rounding, chose)."""
    return bool(math.isfinite(margin) and math.isfinite(shift) and 0.0 <= margin <= shift)


def classify_flip(golden: ScenarioRecord, actual: ScenarioRecord, step: int) -> dict[str, Any]:
    """Why a greedy token differs: a near-tie or not (`is_near_tie` on `margin_shift`).

    Near-tie: the two tokens' logits differ between the sides by at least as much as the
    oracle's margin between them, so a logit error that small explains the flip. Otherwise the
    flip is a real disagreement (or the in-tree logits at that step are not comparable).
    """
    want = golden.tokens[step]
    got = actual.tokens[step] if step < len(actual.tokens) else None
    if got is None or step >= actual.logits.shape[0] or actual.logits.shape[1:] != golden.logits.shape[1:]:
        return {"near_tie": False, "explanation": "not a near-tie: the in-tree logits at that step are missing"}
    g, a = golden.logits[step].astype(np.float64), actual.logits[step].astype(np.float64)
    bad = [side for side, row in (("oracle", g), ("in-tree", a)) if not np.isfinite(row[[want, got]]).all()]
    if bad:
        values = ", ".join(
            f"{side} {want}: {row[want]}, {got}: {row[got]}" for side, row in (("oracle", g), ("in-tree", a))
        )
        return {
            "near_tie": False,
            "non_finite": bad,
            "explanation": f"not a near-tie: non-finite logits on the {' and '.join(bad)} side at that step ({values})",
        }
    oracle_margin, shift = margin_shift(g, a, want, got)  # margin >= 0: the oracle preferred `want`
    if oracle_margin < 0:
        return {
            "near_tie": False,
            "oracle_margin": oracle_margin,
            "margin_shift": shift,
            "explanation": f"not a near-tie: the oracle chose {want} although its raw logit is below {got}'s "
            "(a logit filter, forcing or sampling chose it): the decoding rules differ",
        }
    near = is_near_tie(oracle_margin, shift)
    explanation = (
        f"near-tie: the oracle preferred {want} over {got} by {oracle_margin:.3g}, and the logit "
        f"difference between the sides moves that margin by {shift:.3g}: the logit error explains the flip"
        if near
        else f"not a near-tie: the oracle preferred {want} over {got} by {oracle_margin:.3g}, the sides "
        f"move that margin by only {shift:.3g}: the token choice itself differs (decoding rule, sampling)"
    )
    return {
        "near_tie": near,
        "oracle_margin": oracle_margin,
        "margin_shift": shift,
        "explanation": explanation,
    }


def _where(record: ScenarioRecord, row: int) -> str:
    """` (turn 1 step 3)` for a multi-segment record; nothing for a plain one."""
    segments = record.segments()
    if len(segments) == 1 and segments[0].batch == 1 and not segments[0].label:
        return ""
    return f" ({record.describe_row(row)})"


def _first_difference(a: Sequence, b: Sequence) -> int:
    """Index of the first differing item; the shorter length when one is a prefix of the other."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def compare_prompt(check: str, golden: ScenarioRecord, actual: ScenarioRecord) -> CheckResult:
    """Rendered prompt and token ids identical; for turns and batch rows, each one's."""
    for key in ("turns", "rows"):
        if key in golden.extra:
            mine = actual.extra.get(key, [])
            if len(mine) != len(golden.extra[key]):
                return CheckResult(check, False, f"{len(golden.extra[key])} {key} in the oracle, {len(mine)} in-tree")
            for i, (g, a) in enumerate(zip(golden.extra[key], mine, strict=True)):
                one = _prompt_difference(
                    check, g["rendered_prompt"], g["prompt_ids"], a["rendered_prompt"], a["prompt_ids"]
                )
                if one is not None:
                    one.summary = f"{key[:-1]} {i}: {one.summary}"
                    return one
            total = sum(len(g["prompt_ids"]) for g in golden.extra[key])
            return CheckResult(check, True, f"{len(mine)} {key}' rendered prompts and {total} token ids identical")
    if not golden.prompt_ids:
        raise NothingComparedError(f"{check}: nothing to compare: the golden has no prompt token ids")
    one = _prompt_difference(
        check, golden.rendered_prompt, golden.prompt_ids, actual.rendered_prompt, actual.prompt_ids
    )
    return one or CheckResult(check, True, f"rendered prompt and {len(golden.prompt_ids)} token ids identical")


def _prompt_difference(
    check: str, golden_text: str | None, golden_ids: list[int], actual_text: str | None, actual_ids: list[int]
) -> CheckResult | None:
    if golden_text != actual_text:
        a, b = golden_text or "", actual_text or ""
        at = _first_difference(a, b)
        return CheckResult(
            check,
            False,
            f"rendered prompts differ at character {at}: oracle {a[max(0, at - 20) : at + 20]!r} vs "
            f"in-tree {b[max(0, at - 20) : at + 20]!r} (lengths {len(a)} vs {len(b)})",
            details={"oracle": a, "intree": b},
        )
    if golden_ids != actual_ids:
        g, t = golden_ids, actual_ids
        at = _first_difference(g, t)
        return CheckResult(
            check,
            False,
            f"prompt token ids differ at position {at}: oracle {g[at : at + 5]} vs in-tree {t[at : at + 5]} "
            f"(lengths {len(g)} vs {len(t)})",
            details={"oracle": g, "intree": t},
        )
    return None


def compare_eos(check: str, golden: ScenarioRecord, actual: ScenarioRecord) -> CheckResult:
    if sorted(golden.eos_ids) != sorted(actual.eos_ids):
        return CheckResult(
            check, False, f"EOS id sets differ: oracle {sorted(golden.eos_ids)} vs in-tree {sorted(actual.eos_ids)}"
        )
    if "finish_reason" in golden.extra:  # `stop: eos`: both runs ended themselves, as stream_generate does
        ends = [(len(r.tokens), r.extra.get("finish_reason")) for r in (golden, actual)]
        if ends[0] != ends[1]:
            return CheckResult(
                check,
                False,
                f"the runs end differently: oracle after {ends[0][0]} tokens ({ends[0][1]}), in-tree after "
                f"{ends[1][0]} tokens ({ends[1][1]}) (EOS ids {sorted(golden.eos_ids)})",
                first_bad_step=min(ends[0][0], ends[1][0]) - 1,
                details={"oracle_end": ends[0], "intree_end": ends[1]},
            )
        how = f"at EOS (step {golden.eos_step})" if ends[0][1] == "stop" else "at the step limit, without EOS"
        return CheckResult(
            check, True, f"EOS ids {sorted(golden.eos_ids)} identical; both runs stop {how} after {ends[0][0]} tokens"
        )
    if len(golden.segments()) > 1:
        expected, got = golden.segment_eos_steps(), actual.segment_eos_steps()
        if expected != got:
            bad = next(i for i, (e, a) in enumerate(zip(expected, got, strict=False)) if e != a)
            return CheckResult(
                check,
                False,
                f"{golden.segments()[bad].label}: generation stops at different steps: oracle at {expected[bad]} vs "
                f"in-tree at {got[bad]} (EOS ids {sorted(golden.eos_ids)}; None = no EOS within the steps run)",
            )
        return CheckResult(
            check, True, f"EOS ids {sorted(golden.eos_ids)} identical; per segment both stop at {expected}"
        )
    if golden.eos_step != actual.eos_step:
        return CheckResult(
            check,
            False,
            f"generation stops at different steps: oracle at {golden.eos_step} vs in-tree at {actual.eos_step} "
            f"(EOS ids {sorted(golden.eos_ids)}; None = no EOS within the steps run)",
            first_bad_step=min(s for s in (golden.eos_step, actual.eos_step) if s is not None),
        )
    where = f"at step {golden.eos_step}" if golden.eos_step is not None else "not within the steps run"
    return CheckResult(check, True, f"EOS ids {sorted(golden.eos_ids)} identical; both stop {where}")


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
        return CheckResult(check, False, diff_vectors(expected, got).explain())
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
        f"{what} differs{where}: {diff.explain()}",
        first_bad_step=first,
        steps_compared=len(parts),
        steps_differing=len(bad),
        details={"first_diff": asdict(diff)},
    )


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
