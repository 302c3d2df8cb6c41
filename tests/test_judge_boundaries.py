"""The judges at their boundaries: each rule tested exactly at its threshold and one float64 ULP
(np.nextafter) past it on each side, so that a threshold doubled, halved, made strict or with
its sign changed fails a test (the gate-trust audit's "Judges not tested at their boundaries").

- The near-tie rule (`harness.checks.tokens.is_near_tie` on `margin_shift`) through every
  function of a gate that applies it: `is_near_tie` itself, `classify_flip` (L1 diagnostics),
  `compare_tokens`, the fast-path gate's flip classification and `make calibrate`'s first
  divergences, on float32 logits rows built from small dyadic values, so that the float64
  margin and shift land exactly on (or one float64 ULP off) the boundary.
- The quality metrics (harness/quality/metrics.py): top-1 agreement is paired, the "2 SE" rule
  of `compare_candidates` and the "more than one quantized position" rule of `summarize_llm`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.checks.token_budget import _classify
from harness.checks.tokens import classify_flip, compare_tokens, is_near_tie, margin_shift
from harness.quality import metrics
from harness.records import ScenarioRecord
from harness.tools.calibrate import first_divergences

INF = math.inf


def up(x: float) -> float:
    return float(np.nextafter(x, INF))


def down(x: float) -> float:
    return float(np.nextafter(x, -INF))


# --------------------------------------------------------------------------- is_near_tie


@pytest.mark.parametrize("shift", [0.5, 1e-3, 3.75, 2.0**-40, 1e30])
def test_near_tie_holds_up_to_margin_equal_to_shift_and_not_one_ulp_beyond(shift: float) -> None:
    """margin <= shift, inclusive: margin == shift is a near-tie, one ULP more is not."""
    assert is_near_tie(shift, shift)  # exactly at the boundary (kills `<` and `margin <= shift / 2`)
    assert is_near_tie(down(shift), shift)  # one ULP inside
    assert not is_near_tie(up(shift), shift)  # one ULP outside (kills `margin <= 2 * shift`)
    # the same boundary approached by the shift
    assert is_near_tie(shift, up(shift))
    assert not is_near_tie(shift, down(shift))


def test_near_tie_at_zero_margin_and_one_ulp_below_it() -> None:
    """margin >= 0, inclusive: an exact tie on the expected side is a near-tie whatever the shift
    (even none); the smallest negative margin is never one, however large the shift."""
    tiny = float(np.nextafter(0.0, 1.0))  # 5e-324
    assert is_near_tie(0.0, 0.0)  # kills `0.0 < margin`
    assert is_near_tie(-0.0, 0.0)
    assert is_near_tie(0.0, tiny)
    assert not is_near_tie(tiny, 0.0)  # one ULP above a zero shift
    assert not is_near_tie(-tiny, 1.0)  # kills `abs(margin) <= shift` and a dropped lower bound
    assert not is_near_tie(-tiny, INF)
    assert not is_near_tie(-1.0, 1.0)  # kills `-shift <= margin <= shift`


@pytest.mark.parametrize("margin, shift", [(INF, INF), (math.nan, 1.0), (1.0, math.nan), (0.0, INF), (-INF, 1.0)])
def test_a_non_finite_margin_or_shift_is_never_a_near_tie(margin: float, shift: float) -> None:
    assert not is_near_tie(margin, shift)


# --------------------------------------------------------------------------- float32 logits rows

WANT, GOT = 1, 0  # the oracle chose token 1, the other side token 0 (argmax's choice on an exact tie)
H = 0.5
E53, E54 = 2.0**-53, 2.0**-54  # float64's ULP just above 0.5 and just below it; exact in float32

# (oracle's logits of GOT and WANT, the other side's, margin and shift they give in float64,
# near-tie?). Every value is a float32 (dyadic), every difference exact in float64.
ROWS = {
    # the other side ties exactly: the shift is the margin itself
    "at the boundary": ((0.0, H), (0.0, 0.0), H, H, True),
    "shift one ulp above the margin": ((0.0, H), (E53, 0.0), H, up(H), True),
    "shift one ulp below the margin": ((0.0, H), (0.0, E54), H, down(H), False),
    "margin one ulp above the shift": ((-E53, H), (0.0, E53), up(H), H, False),
    "margin one ulp below the shift": ((E54, H), (E54, 0.0), down(H), H, True),
    "zero margin, zero shift": ((0.25, 0.25), (0.25, 0.25), 0.0, 0.0, True),
}


def _row(got: float, want: float) -> np.ndarray:
    row = np.full(4, -1.0, np.float32)
    row[GOT], row[WANT] = got, want
    assert (row[GOT], row[WANT]) == (got, want)  # exact in float32
    return row


def _record(row: np.ndarray, token: int) -> ScenarioRecord:
    return ScenarioRecord("s", None, [], [token], row[None].copy(), [3])


@pytest.mark.parametrize("case", list(ROWS))
def test_margin_and_shift_of_float32_rows_land_exactly_on_the_boundary(case: str) -> None:
    oracle, other, margin, shift, _ = ROWS[case]
    assert margin_shift(_row(*oracle), _row(*other), WANT, GOT) == (margin, shift)


@pytest.mark.parametrize("case", list(ROWS))
def test_classify_flip_at_the_boundary(case: str) -> None:
    oracle, other, margin, shift, near = ROWS[case]
    flip = classify_flip(_record(_row(*oracle), WANT), _record(_row(*other), GOT), 0)
    assert (flip["oracle_margin"], flip["margin_shift"]) == (margin, shift)
    assert flip["near_tie"] is near, flip["explanation"]
    assert flip["explanation"].startswith("near-tie" if near else "not a near-tie")


def test_classify_flip_one_float32_step_below_a_zero_margin_is_a_rule_not_a_rounding() -> None:
    """An oracle that chose the token whose raw logit is the smallest float32 step below the
    other's: the decoding rules differ, whatever the shift (kills a threshold moved below zero,
    `oracle_margin < -x`; the zero-margin case above kills `oracle_margin <= 0`)."""
    sub = float(np.float32(2.0**-149))  # float32's smallest subnormal
    flip = classify_flip(_record(_row(sub, 0.0), WANT), _record(_row(5.0, 0.0), GOT), 0)
    assert flip["oracle_margin"] == -sub and not flip["near_tie"]
    assert "the decoding rules differ" in flip["explanation"]


@pytest.mark.parametrize("case", ["at the boundary", "shift one ulp below the margin"])
def test_compare_tokens_reports_the_flip_at_the_boundary(case: str) -> None:
    oracle, other, margin, shift, near = ROWS[case]
    result = compare_tokens("greedy_tokens", _record(_row(*oracle), WANT), _record(_row(*other), GOT))
    assert not result.passed and result.first_bad_step == 0
    assert result.details["flip"]["near_tie"] is near
    assert (result.details["flip"]["oracle_margin"], result.details["flip"]["margin_shift"]) == (margin, shift)


@pytest.mark.parametrize("case", list(ROWS))
def test_the_fast_path_gate_classifies_a_flip_at_the_boundary(case: str) -> None:
    """token_budget's rule 4(c) on finite logits: margin and error from margin_shift, judged by
    is_near_tie (oracle rows first, fast rows second)."""
    oracle, other, margin, shift, near = ROWS[case]
    g, a = _row(*oracle), _row(*other)
    flip = _classify("here", 0, WANT, GOT, g, a, g, a, None, None)  # no filter is consulted on finite logits
    assert (flip["margin"], flip["error"], flip["kind"]) == (margin, shift, "logits")
    assert flip["near_tie"] is near, flip["explanation"]


@pytest.mark.parametrize("case", list(ROWS))
def test_calibration_first_divergences_at_the_boundary(case: str) -> None:
    """make calibrate: the reference run's gap and the variant's logit error at the first
    differing step, judged by is_near_tie (reference rows first, variant rows second)."""
    oracle, other, margin, shift, near = ROWS[case]
    call = {"row_offset": 0, "temperature": 0.0}
    (d,) = first_divergences(
        [call | {"chosen": [WANT]}], _row(*oracle)[None], [call | {"chosen": [GOT]}], _row(*other)[None]
    )
    assert (d["reference_gap"], d["logit_error"], d["near_tie"]) == (margin, shift, near)


# --------------------------------------------------------------------------- quality metrics


def test_top1_agreement_is_paired_position_by_position() -> None:
    """Arrays holding the same tokens in another order: sorted, they agree everywhere; paired,
    at positions 2 and 3 only."""
    control = np.array([5, 7, 7, 9, 11, 4], np.int32)
    candidate = np.array([7, 5, 7, 9, 4, 11], np.int32)
    assert np.array_equal(np.sort(control), np.sort(candidate))
    got = metrics.agreement(control, candidate)
    p = 2 / 6
    assert got.value == p
    assert got.se == math.sqrt(p * (1 - p) / 6)


def _comparison(diffs: list[float]) -> metrics.Comparison:
    """Two candidates whose KL differ by `diffs` per position (the second one's KL all zero)."""
    return metrics.compare_candidates("a", np.array(diffs), "b", np.zeros(len(diffs)))


def test_two_candidates_exactly_two_se_apart_are_not_distinguishable() -> None:
    """|diff| > 2 SE, strict. Two positions differing by 3 and 1: mean 2, SE = |3 - 1| / 2 = 1
    (sd with ddof=1 is sqrt(2), over sqrt(2)), exactly in float64."""
    at = _comparison([3.0, 1.0])
    assert (at.diff, at.se) == (2.0, 1.0)
    assert not at.distinguishable  # kills `>=` and `> 1 * SE`
    assert not _comparison([-3.0, -1.0]).distinguishable
    # one ULP beyond: 3 one ULP up (2**-51 on [2, 4)) and 1 by the same 2**-51 (two ULPs on
    # [1, 2)): the deviations stay +-1, so the SE stays 1, and the mean is the next float64 above 2
    beyond = _comparison([up(3.0), 1.0 + 2.0**-51])
    assert (beyond.diff, beyond.se) == (up(2.0), 1.0)
    assert beyond.distinguishable  # kills `> 4 * SE` (a doubled rule)
    negative = _comparison([-up(3.0), -(1.0 + 2.0**-51)])
    assert negative.diff == -up(2.0) and negative.distinguishable  # kills a dropped abs()
    # one ULP inside: 1 three ULPs (3 * 2**-53) down; float64 rounds the mean to the float64 just
    # below 2 and leaves the SE at 1 (checked: that is the premise)
    inside = _comparison([3.0, 1.0 - 3 * 2.0**-53])
    assert (inside.diff, inside.se) == (down(2.0), 1.0)
    assert not inside.distinguishable


def _llm_arrays(quantized: int) -> dict[str, np.ndarray]:
    n = 6
    kl = np.arange(1, n + 1, dtype=np.float32) / 8
    return {
        "kl": kl,
        "control_nll": np.full(n, 2.0, np.float32),
        "candidate_nll": np.full(n, 2.5, np.float32),
        "control_top1": np.arange(n, dtype=np.int32),
        "candidate_top1": np.arange(n, dtype=np.int32),
        "quantized": np.arange(n) >= n - quantized,
        "targets": np.zeros(n, np.int32),
    }


def test_quantized_kl_mean_needs_more_than_one_quantized_position() -> None:
    """`quantized.sum() > 1`: one quantized position has no SE, so no mean is reported; two do."""
    assert metrics.summarize_llm(_llm_arrays(0)).kl_quantized_mean is None
    assert metrics.summarize_llm(_llm_arrays(1)).kl_quantized_mean is None  # kills `>= 1` (`> 0`)
    two = metrics.summarize_llm(_llm_arrays(2))
    assert two.quantized_positions == 2
    assert two.kl_quantized_mean is not None  # kills `> 2`
    assert two.kl_quantized_mean.value == (5 / 8 + 6 / 8) / 2
    assert two.kl_quantized_mean.se == (6 / 8 - 5 / 8) / 2  # |a - b| / 2 for two positions
    assert math.isnan(metrics.mean_se(np.array([1.0])).se)  # one position: no SE (`x.size > 1`)
