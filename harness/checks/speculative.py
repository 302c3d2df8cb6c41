"""The `speculative` gate: draft-model speculative decoding judged verify step by verify step.

A draft scenario's record (both sides, see oracles/common/lm_speculative.py) holds the
yielded tokens, array `verify_logits` (every verify call's raw target rows, the current
token's and each draft's position, stacked in call order) and `step_info` per token, whose
last token of each verify step carries that step's drafted / accepted counts, the target's
cache offset and the draft cache's state after the rewind.

Verify step j is judged in order: its rows bit for bit, then its counts, tokens and cache
state (equal JSON); the first difference is reported naming the step (and the position in
the verify call). Then the final tokens. Against a compact golden without the blob at hand,
the verify rows are judged by the sha256 of the whole array.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.checks.compare import CheckResult, diff_vectors, first_json_difference
from harness.errors import NothingComparedError
from harness.records import ScenarioRecord, array_sha256

NAME = "speculative"
ARRAY = "verify_logits"


def verify_steps(record: ScenarioRecord) -> list[dict[str, Any]]:
    """Per verify step: its step_info entry plus the tokens it yielded and their from_draft flags."""
    steps, start = [], 0
    infos = record.extra.get("step_info") or []
    for i, info in enumerate(infos):
        if "verify_step" in info:
            flags = [bool(x.get("from_draft")) for x in infos[start : i + 1]]
            steps.append(info | {"tokens": record.tokens[start : i + 1], "from_draft": flags})
            start = i + 1
    return steps


def _fail(summary: str, step: int | None = None, **details: Any) -> CheckResult:
    return CheckResult(NAME, False, summary, first_bad_step=step, details=details)


def judge_speculative(golden: ScenarioRecord, actual: ScenarioRecord) -> CheckResult:
    expected, got = verify_steps(golden), verify_steps(actual)
    if not expected:
        raise NothingComparedError(f"{NAME}: nothing to compare: the golden records no verify steps (no draft run)")
    if ARRAY not in actual.arrays:
        return _fail(f"wrong tensors: the in-tree record has no {ARRAY!r} array")
    g_rows, a_rows = golden.arrays.get(ARRAY), actual.arrays[ARRAY]
    g_at = a_at = 0
    for j, g in enumerate(expected):
        if j >= len(got):
            return _fail(f"in-tree ran {len(got)} verify steps, the oracle {len(expected)}", j)
        a = got[j]
        if g_rows is not None:
            for p in range(min(int(g["drafted"]), int(a["drafted"])) + 1):
                if a_at + p >= len(a_rows) or g_at + p >= len(g_rows):
                    return _fail(f"verify step {j}: verify_logits has too few rows", j)
                diff = diff_vectors(g_rows[g_at + p], a_rows[a_at + p])
                if not diff.equal:
                    return _fail(f"verify step {j} position {p} (target logits row): {diff.explain()}", j)
        found = first_json_difference(g, a)
        if found is not None:
            path, e, x = found
            return _fail(
                f"verify step {j}: {path.lstrip('.')} differs: oracle {e!r} vs in-tree {x!r}",
                j,
                path=path,
                oracle=e,
                intree=x,
            )
        g_at += int(g["drafted"]) + 1
        a_at += int(a["drafted"]) + 1
    if len(got) != len(expected):
        return _fail(f"in-tree ran {len(got)} verify steps, the oracle {len(expected)}", len(expected))
    if actual.tokens != golden.tokens:
        i = next((i for i, (e, x) in enumerate(zip(golden.tokens, actual.tokens, strict=False)) if e != x), None)
        return _fail(f"final tokens differ (at token {i}; {len(golden.tokens)} vs {len(actual.tokens)} tokens)", i)
    if g_rows is None:
        digest = golden.array_digests.get(ARRAY)
        if digest is None:
            raise NothingComparedError(f"{NAME}: the golden has neither {ARRAY!r} nor its digest")
        if array_sha256(np.ascontiguousarray(a_rows)) != digest:
            return _fail(f"{ARRAY} differs from the golden's sha256 (its blob is not at hand to say where)")
    elif a_rows.shape != g_rows.shape:
        return _fail(f"{ARRAY}: oracle {g_rows.shape} vs in-tree {a_rows.shape}")
    accepted = [int(s["accepted"]) for s in expected]
    return CheckResult(
        NAME,
        True,
        f"{len(expected)} verify steps ({g_at} target rows) bit-identical, accepted {accepted}, "
        f"{len(golden.tokens)} tokens and the draft cache after every rewind identical",
        steps_compared=len(expected),
        details={"accepted": accepted, "drafted": [int(s["drafted"]) for s in expected]},
    )
