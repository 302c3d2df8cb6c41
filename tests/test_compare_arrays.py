"""The comparator's less-walked paths, each pinned by a value worked out here by hand: named
tensors (compare_array), the sampling view of a differing row (agreement), the row names of a
multi-segment record (where), JSON lengths, ULPs at zero. Written for the survivors of make
mutate on harness/checks/compare.py (docs/mutants.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.checks.compare import (
    ULP_BUCKETS,
    CheckResult,
    agreement,
    compare_array,
    compare_steps,
    diff_vectors,
    first_json_difference,
    top_k,
    ulp_distance,
    ulp_histogram,
    where,
)
from harness.records import ScenarioRecord


def _record(arrays: dict[str, np.ndarray] | None = None, rows: int = 2, **extra) -> ScenarioRecord:
    logits = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    return ScenarioRecord(
        scenario_id="s",
        rendered_prompt="p",
        prompt_ids=[1],
        tokens=[0] * rows,
        logits=logits,
        eos_ids=[9],
        arrays=dict(arrays or {}),
        extra=extra,
    )


def _mel(shape: tuple[int, ...]) -> np.ndarray:
    return np.linspace(-1.0, 1.0, math.prod(shape), dtype=np.float32).reshape(shape)


def test_identical_tensors_pass_and_count_their_first_axis_only_when_stacked() -> None:
    flat = compare_array("mel", _record({"mel": _mel((4, 5))}), _record({"mel": _mel((4, 5))}), "mel")
    assert flat.passed and flat.steps_compared == 1 and "bit-identical" in flat.summary
    stacked = compare_array("mel", _record({"mel": _mel((3, 4, 5))}), _record({"mel": _mel((3, 4, 5))}), "mel")
    assert stacked.passed and stacked.steps_compared == 3


def test_a_missing_tensor_fails_on_either_side() -> None:
    have, lack = _record({"mel": _mel((2, 2))}), _record({})
    missing_golden = compare_array("mel", lack, have, "mel")
    assert not missing_golden.passed and "the golden has no 'mel'" in missing_golden.summary
    missing_intree = compare_array("mel", have, lack, "mel")
    assert not missing_intree.passed and "in-tree record has no 'mel'" in missing_intree.summary


def test_ext2_f9_a_longer_first_axis_compares_the_rows_both_have_and_shows_the_padding() -> None:
    """external-2 F9: funasr-mlx's log-mel had 3582 frames against mlx-whisper's 3000 and the report
    gave only the two shapes; the decisive difference (the padding: the mel of silence, -0.702,
    where the oracle pads the log-mel with zeros) took a by-hand script. Scaled down: 6 rows of
    speech, the oracle's 4 padding rows zero, the in-tree's 7 rows of -0.702."""
    speech = _mel((6, 5))
    oracle = np.concatenate([speech, np.zeros((4, 5), np.float32)])
    intree = np.concatenate([speech, np.full((7, 5), -0.702, np.float32)])
    result = compare_array("mel", _record({"mel": oracle}), _record({"mel": intree}), "mel")
    assert not result.passed and result.summary.startswith("wrong tensor: oracle (10, 5) float32 vs in-tree (13, 5)")
    assert "the first 10 rows, which both have, differ in 4: first row 6 (max |Δ| 0.702)" in result.summary
    assert "at row 6: oracle 0 throughout vs in-tree -0.702 throughout" in result.summary
    assert result.summary.endswith("the in-tree's 3 rows past them hold -0.702 throughout")
    same = compare_array("mel", _record({"mel": oracle}), _record({"mel": speech}), "mel")
    assert "the first 6 rows, which both have, are bit-identical; the oracle's 4 rows past them hold 0 throughout" in (
        same.summary
    )
    other_width = compare_array("mel", _record({"mel": speech}), _record({"mel": _mel((6, 4))}), "mel")
    assert "rows, which both have" not in other_width.summary
    for golden, got in ((np.zeros((0, 5), np.float32), speech), (np.float32(1.0), np.ones(1, np.float32))):
        nothing_shared = compare_array("mel", _record({"mel": np.asarray(golden)}), _record({"mel": got}), "mel")
        assert not nothing_shared.passed and "rows, which both have" not in nothing_shared.summary
    no_width = compare_array(
        "mel", _record({"mel": np.zeros((2, 0), np.float32)}), _record({"mel": np.zeros((3, 0), np.float32)}), "mel"
    )
    assert no_width.summary.endswith("are bit-identical; the in-tree's 1 rows past them hold no values")


@pytest.mark.parametrize("other", [np.zeros((2, 3), np.float32), np.zeros((2, 2), np.float16)])
def test_another_shape_or_dtype_is_a_wrong_tensor(other: np.ndarray) -> None:
    mine = np.zeros((2, 2), np.float32)
    for golden, got in ((mine, other), (other, mine)):  # either side the larger
        result = compare_array("mel", _record({"mel": golden}), _record({"mel": got}), "mel")
        assert not result.passed and result.summary.startswith("wrong tensor"), result.summary
        assert diff_vectors(golden.reshape(-1), got.reshape(-1)).shape_mismatch


@pytest.mark.parametrize("sign", [1.0, -1.0])  # the in-tree value above, then below the oracle's
def test_a_stacked_tensor_names_its_first_differing_index(sign: float) -> None:
    golden = _mel((3, 4, 5))
    mine = golden.copy()
    mine[1, 2, 3] += sign * 0.5
    mine[2, 0, 0] += sign * 0.25
    result = compare_array("mel", _record({"mel": golden}), _record({"mel": mine}), "mel")
    assert not result.passed
    assert (result.first_bad_step, result.steps_compared, result.steps_differing) == (1, 3, 2)
    assert "(index 1 of the first axis: 2/3 differ)" in result.summary
    first = result.details["first_diff"]
    assert first["first_index"] == 13 and first["n_elements"] == 20 and first["n_differing"] == 1


def test_a_flat_tensor_difference_names_no_index() -> None:
    golden = _mel((4, 5))
    mine = golden.copy()
    mine[3, 1] = -mine[3, 1]
    result = compare_array("mel", _record({"mel": golden}), _record({"mel": mine}), "mel")
    assert not result.passed and "index" not in result.summary.split("differs")[1].split(":")[0]
    assert result.details["first_diff"]["first_index"] == 16


def test_absolute_and_relative_differences_are_exact() -> None:
    diff = diff_vectors(np.array([2.0, 5.0], np.float32), np.array([3.0, 5.0], np.float32))
    assert (diff.max_abs_diff, diff.max_rel_diff, diff.n_differing) == (1.0, 0.5, 1)
    same = diff_vectors(np.ones(3, np.float32), np.ones(3, np.float32))
    assert same.equal and (same.max_abs_diff, same.max_rel_diff, same.max_ulp) == (0.0, 0.0, 0)
    assert CheckResult("c", True, "s").steps_differing == 0


def test_agreement_is_the_float64_kl_and_top1_of_the_row() -> None:
    e = np.array([0.0, 0.0], np.float32)  # p = (1/2, 1/2)
    a = np.array([0.0, math.log(3.0)], np.float32)  # q = (1/4, 3/4)
    kl = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    got = agreement(e, a, diff_vectors(e, a))
    assert got["top1"] is False and got["kl"] == pytest.approx(kl, rel=1e-6)
    shifted = agreement(e + 1000, a + 1000, diff_vectors(e + 1000, a + 1000))  # stable for large logits
    assert shifted["kl"] == pytest.approx(kl, rel=1e-4)
    masked = np.array([-np.inf, 0.0, 0.0], np.float32), np.array([-np.inf, 0.0, math.log(3.0)], np.float32)
    assert agreement(*masked, diff_vectors(*masked))["kl"] == pytest.approx(kl, rel=1e-6)
    ties = np.array([1.0, 0.0], np.float32), np.array([1.0, -0.0], np.float32)
    assert agreement(*ties, diff_vectors(*ties)) == {"kl": 0.0, "top1": True}
    nothing = np.array([np.nan, -np.inf], np.float32), np.array([np.nan, np.inf], np.float32)
    assert agreement(*nothing, diff_vectors(*nothing)) == {"kl": None, "top1": True}
    parted = np.array([np.nan, -np.inf], np.float32), np.array([-np.inf, np.nan], np.float32)
    for x, y in (parted, parted[::-1]):  # no finite value, the argmaxes apart, either way round
        assert agreement(x, y, diff_vectors(x, y)) == {"kl": None, "top1": False}
    assert agreement(a, e, diff_vectors(a, e))["top1"] is False  # the in-tree top-1 first, then the oracle's
    wrong = np.zeros(2, np.float32), np.zeros(3, np.float32)
    assert agreement(*wrong, diff_vectors(*wrong)) == {}
    assert agreement(e, e, diff_vectors(e, e)) == {"kl": 0.0, "top1": True}


def test_agreement_never_reports_a_negative_kl() -> None:
    """Float rounding can make the sum a hair below zero for rows one ULP apart; a KL is >= 0."""
    rng = np.random.default_rng(7)
    for _ in range(400):
        e = rng.standard_normal(64).astype(np.float32)
        a = e.copy()
        i = int(rng.integers(64))
        a[i] = np.nextafter(a[i], np.float32(np.inf))
        e64, a64 = e.astype(np.float64), a.astype(np.float64)
        log_p = e64 - (e64.max() + np.log(np.exp(e64 - e64.max()).sum()))
        log_q = a64 - (a64.max() + np.log(np.exp(a64 - a64.max()).sum()))
        if float(np.sum(np.exp(log_p) * (log_p - log_q))) < 0:
            assert agreement(e, a, diff_vectors(e, a))["kl"] == 0.0
            return
    pytest.fail("no row pair gave a negative raw KL: the clamp is not exercised")


def test_top_k_defaults_to_five_in_descending_order() -> None:
    x = np.array([3, 9, 1, 7, 5, 8, 2], np.float32)
    assert [i for i, _ in top_k(x)] == [1, 5, 3, 4, 0]


def test_ulps_are_counted_across_positive_zero() -> None:
    tiny = np.nextafter(np.float32(0), np.float32(1))
    assert ulp_distance(np.array([0.0], np.float32), np.array([tiny]))[0] == 1
    assert ulp_distance(np.array([tiny]), np.array([0.0], np.float32))[0] == 1
    assert ulp_distance(np.array([0.0], np.float32), np.array([-0.0], np.float32))[0] == 0


def test_json_lists_of_other_lengths_differ_by_length() -> None:
    assert first_json_difference([1, 2, 3], [1, 2]) == (" (length)", 3, 2)
    assert first_json_difference([1, 2], [1, 2, 3]) == (" (length)", 2, 3)
    assert first_json_difference({"a": [1]}, {"a": [1, 4]}) == (".a (length)", 1, 2)


def test_rows_of_a_batch_or_of_several_segments_are_named() -> None:
    assert where(_record(rows=2), 1) == ""
    batch = _record(rows=4, decode_calls=[{"row_offset": 0, "n_steps": 2, "batch": 2}])
    assert where(batch, 3) == " (decode call 0 step 1 member 1)"
    turns = _record(rows=2, turns=[{"row_offset": 0, "n_steps": 1}, {"row_offset": 1, "n_steps": 1}])
    assert where(turns, 1) == " (turn 1 step 0)"


def test_equal_rows_fill_the_zero_ulp_bucket() -> None:
    golden = _record(rows=2)
    mine = _record(rows=2)
    mine.logits[1, 2] = np.nextafter(mine.logits[1, 2], np.float32(np.inf))
    result = compare_steps("decode_logits", golden, mine, [0, 1])
    histogram = result.details["ulp_histogram"]
    assert histogram["0"] == 3 + 2 and histogram["1"] == 1


def test_json_of_another_kind_differs_at_the_value() -> None:
    assert first_json_difference({"a": 1}, [1]) == ("(value)", {"a": 1}, [1])
    assert first_json_difference([1], {"a": 1}) == ("(value)", [1], {"a": 1})


def test_the_widest_ulp_buckets() -> None:
    one = np.array([1.0], np.float32)
    bits = one.view(np.int32)
    far = (bits + (1 << 19)).view(np.float32), (bits + (1 << 20)).view(np.float32)
    assert ULP_BUCKETS[-2:] == ["524288-1048575", ">=1048576"] and len(ULP_BUCKETS) == 22
    assert ulp_histogram(np.repeat(one, 2), np.concatenate(far)).tolist() == [0] * 20 + [1, 1]
    assert diff_vectors(one, one.copy()).n_differing == 0


def test_a_four_dimensional_tensor_is_judged_along_its_first_axis() -> None:
    golden = _mel((2, 3, 4, 5))
    assert compare_array("enc", _record({"enc": golden}), _record({"enc": golden.copy()}), "enc").steps_compared == 2
    mine = golden.copy()
    mine[1, 0, 0, 1] = 7.0
    result = compare_array("enc", _record({"enc": golden}), _record({"enc": mine}), "enc")
    assert (result.first_bad_step, result.steps_compared) == (1, 2) and "(index 1 of the first axis: 1/2 differ)" in (
        result.summary
    )


def test_rows_of_another_width_stop_the_comparison_at_the_first() -> None:
    golden, wide = _record(rows=3), _record(rows=3)
    wide.logits = np.zeros((3, 4), np.float32)
    result = compare_steps("decode_logits", golden, wide, [0, 1, 2])
    assert not result.passed and result.steps_differing == 1 and "wrong tensor" in result.summary
    assert result.details["ulp_histogram"]["0"] == 3


def test_a_shorter_in_tree_run_is_judged_on_the_rows_both_made() -> None:
    golden, short = _record(rows=3), _record(rows=2)
    short.tokens = short.tokens[:2]
    result = compare_steps("decode_logits", golden, short, [0, 1, 2])
    assert not result.passed and result.steps_compared == 2 and result.first_bad_step == 2
    assert "where the in-tree run stopped" in result.summary
    empty = _record(rows=2)
    empty.logits, empty.tokens = np.zeros((0, 3), np.float32), []
    none = compare_steps("decode_logits", golden, empty, [0, 1])
    assert not none.passed and none.steps_compared == 0 and none.per_step == []


def test_a_key_on_one_side_only_is_the_difference() -> None:
    assert first_json_difference({"a": 1}, {"a": 1, "b": 2}) == (".b", "<absent>", 2)
    assert first_json_difference({"a": 1, "b": 2}, {"a": 1}) == (".b", 2, "<absent>")
    assert CheckResult("c", True, "s").steps_compared == 0
