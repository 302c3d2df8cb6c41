"""The comparator: raw-bit verdicts and failure explanations."""

from __future__ import annotations

import numpy as np
import pytest

from harness.checks.compare import compare_steps, diff_vectors, ulp_distance
from harness.checks.tokens import compare_eos, compare_prompt, compare_tokens
from harness.records import ScenarioRecord


def record(logits: np.ndarray, tokens: list[int] | None = None, **kw) -> ScenarioRecord:
    tokens = tokens if tokens is not None else [int(np.argmax(r)) for r in logits]
    defaults = dict(scenario_id="s", rendered_prompt="p", prompt_ids=[1, 2], eos_ids=[0])
    return ScenarioRecord(tokens=tokens, logits=logits.astype(np.float32), **(defaults | kw))


def test_ulp_distance_counts_representable_floats() -> None:
    x = np.float32(1.5)
    up = np.nextafter(x, np.float32(np.inf))
    assert ulp_distance(np.array([x]), np.array([up]))[0] == 1
    assert ulp_distance(np.array([-x]), np.array([-np.nextafter(up, np.float32(np.inf))]))[0] == 2
    tiny = np.nextafter(np.float32(0), np.float32(1))
    assert ulp_distance(np.array([-tiny]), np.array([tiny]))[0] == 2  # across zero


def test_identical_vectors_are_equal() -> None:
    v = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    assert diff_vectors(v, v.copy()).equal


def test_signed_zero_is_a_difference_in_bits() -> None:
    """Bit-exact means raw bits: allclose would call these equal, the gate must not."""
    a, b = np.zeros(4, np.float32), np.zeros(4, np.float32)
    b[2] = -0.0
    diff = diff_vectors(a, b)
    assert not diff.equal and diff.n_differing == 1 and diff.first_index == 2


def test_one_ulp_difference_is_explained() -> None:
    v = np.linspace(-3, 5, 50, dtype=np.float32)
    w = v.copy()
    w[7] = np.nextafter(w[7], np.float32(np.inf))
    diff = diff_vectors(v, w)
    assert (diff.n_differing, diff.first_index, diff.max_ulp) == (1, 7, 1)
    text = diff.explain()
    assert "1/50 elements differ" in text and "max ULP 1" in text and "first at index 7" in text
    assert diff.expected_top5[0][0] == 49


def test_shape_mismatch_is_a_wrong_tensor_failure() -> None:
    diff = diff_vectors(np.zeros(5, np.float32), np.zeros(6, np.float32))
    assert not diff.equal and "wrong tensor" in diff.explain()


def test_compare_steps_names_the_first_bad_step() -> None:
    g = np.random.default_rng(1).standard_normal((6, 20)).astype(np.float32)
    a = g.copy()
    a[3, 5] += 1e-3
    a[5, 0] += 1.0
    result = compare_steps("decode_logits", record(g), record(a), range(1, 6))
    assert not result.passed and result.first_bad_step == 3 and result.steps_differing == 2
    assert "first differing step 3 (2/5 steps differ)" in result.summary
    assert compare_steps("decode_logits", record(g), record(g.copy()), range(1, 6)).passed


def test_each_step_carries_the_oracle_rows_logit_range() -> None:
    """The sign-off plots max |diff| relative to it: max - min of the oracle's finite values."""
    g = np.random.default_rng(2).standard_normal((4, 30)).astype(np.float32)
    g[2, 7] = -np.inf  # a masked logit does not make the range infinite
    a = g.copy()
    a[1, 3] += 0.5
    result = compare_steps("decode_logits", record(g), record(a), range(4))
    ranges = [s["logit_range"] for s in result.per_step]
    finite = [row[np.isfinite(row)] for row in g.astype(np.float64)]
    assert ranges == [float(f.max() - f.min()) for f in finite]
    assert all(np.isfinite(ranges)) and result.per_step[1]["max_abs_diff"] / ranges[1] < 1


def test_compare_tokens_reports_divergence_and_margin() -> None:
    g = np.zeros((4, 3), np.float32)
    g[:, 1] = 2.0
    g[:, 2] = 1.5
    result = compare_tokens("greedy_tokens", record(g), record(g, tokens=[1, 1, 2, 2]))
    assert not result.passed and result.first_bad_step == 2
    assert "margin there 0.5" in result.summary


def test_prompt_identity_points_at_the_difference() -> None:
    logits = np.zeros((1, 3), np.float32)
    result = compare_prompt(
        "p", record(logits, rendered_prompt="<s>user\nhi"), record(logits, rendered_prompt="<s>user hi")
    )
    assert not result.passed and "character 7" in result.summary
    result = compare_prompt("p", record(logits, prompt_ids=[1, 2, 3]), record(logits, prompt_ids=[1, 2, 4]))
    assert not result.passed and "position 2" in result.summary


@pytest.mark.parametrize(
    ("oracle_eos", "intree_eos", "tokens_a", "ok"),
    [([2], [2], [5, 2, 7], True), ([2], [2, 9], [5, 2, 7], False), ([2], [2], [5, 5, 2], False)],
)
def test_eos_stop(oracle_eos, intree_eos, tokens_a, ok) -> None:
    logits = np.zeros((3, 10), np.float32)
    golden = record(logits, tokens=[5, 2, 7], eos_ids=oracle_eos)
    actual = record(logits, tokens=tokens_a, eos_ids=intree_eos)
    assert compare_eos("eos_stop", golden, actual).passed is ok


def test_ulp_histogram_buckets_by_powers_of_two() -> None:
    from harness.checks.compare import ULP_BUCKETS, ulp_histogram

    base = np.ones(5, np.float32)
    bits = base.view(np.int32).copy()
    bits[1:] += np.array([1, 3, 4, 1 << 25], dtype=np.int32)
    counts = dict(zip(ULP_BUCKETS, ulp_histogram(base, bits.view(np.float32)).tolist(), strict=True))
    assert {k: v for k, v in counts.items() if v} == {"0": 1, "1": 1, "2-3": 1, "4-7": 1, ">=1048576": 1}


def test_json_results_compare_exactly_and_nan_only_matches_nan() -> None:
    from harness.checks.compare import compare_json

    same = {"text": " hi", "segments": [{"avg_logprob": float("nan"), "end": 1.5}]}
    assert compare_json(
        "transcript", "transcript", same, {"text": " hi", "segments": [{"avg_logprob": float("nan"), "end": 1.5}]}
    ).passed
    moved = compare_json(
        "transcript", "transcript", same, {"text": " hi", "segments": [{"avg_logprob": -0.5, "end": 1.5}]}
    )
    assert not moved.passed and "segments[0].avg_logprob" in moved.summary
    one_ulp = compare_json("t", "t", {"end": 1.5}, {"end": 1.5000000000000002})
    assert not one_ulp.passed and "end" in one_ulp.summary
    typed = compare_json("t", "t", {"n": 1}, {"n": 1.0})
    assert not typed.passed


def test_token_flips_are_classified_as_near_ties_or_not() -> None:
    from harness.checks.tokens import compare_tokens

    def record(logits: list[list[float]], tokens: list[int]) -> ScenarioRecord:
        return ScenarioRecord("s", None, [1], tokens, np.array(logits, dtype=np.float32), [2])

    oracle = record([[1.0, 1.001, 0.0]], [1])
    near = compare_tokens("greedy_tokens", oracle, record([[1.002, 1.001, 0.0]], [0]))
    assert not near.passed and near.details["flip"]["near_tie"], near.summary
    assert "near-tie" in near.summary
    # Same logits bit for bit, a different choice: a decoding rule, not arithmetic.
    rule = compare_tokens("greedy_tokens", oracle, record([[1.0, 1.001, 0.0]], [0]))
    assert not rule.passed and not rule.details["flip"]["near_tie"] and "not a near-tie" in rule.summary
    # A NaN on either side is named as such, never labelled a decoding rule.
    nan = compare_tokens("greedy_tokens", oracle, record([[float("nan"), 1.001, 0.0]], [0]))
    flip = nan.details["flip"]
    assert not nan.passed and not flip["near_tie"] and flip["non_finite"] == ["in-tree"]
    assert "non-finite logits on the in-tree side" in nan.summary and "decoding rule" not in nan.summary


def test_eos_stop_is_judged_per_segment() -> None:
    from harness.checks.tokens import compare_eos

    def record(tokens: list[int]) -> ScenarioRecord:
        rows = [{"row_offset": 0, "n_steps": 3}, {"row_offset": 3, "n_steps": 3}]
        logits = np.zeros((6, 4), dtype=np.float32)
        return ScenarioRecord("s", None, [1], tokens, logits, [2], extra={"rows": rows})

    assert compare_eos("eos_stop", record([0, 2, 0, 0, 0, 2]), record([0, 2, 0, 0, 0, 2])).passed
    late = compare_eos("eos_stop", record([0, 2, 0, 0, 0, 2]), record([0, 2, 0, 0, 0, 0]))
    assert not late.passed and "batch row 1" in late.summary, late.summary


def test_nothing_to_compare_is_an_error_never_a_pass() -> None:
    """Issue 15 part 2: no rows, no tokens, no prompt, no transcript: an error, not a pass."""
    from harness.checks.compare import compare_json
    from harness.errors import NothingComparedError

    empty = record(np.zeros((0, 4), dtype=np.float32), [])
    with pytest.raises(NothingComparedError, match="decode_logits: nothing to compare: the golden has no logits rows"):
        compare_steps("decode_logits", empty, empty, [])
    with pytest.raises(NothingComparedError, match="greedy_tokens: nothing to compare: the golden has no tokens"):
        compare_tokens("greedy_tokens", empty, empty)
    no_prompt = record(np.zeros((1, 4), dtype=np.float32), [1])
    no_prompt.prompt_ids = []
    with pytest.raises(NothingComparedError, match="prompt_identity: nothing to compare"):
        compare_prompt("prompt_identity", no_prompt, no_prompt)
    for value in (None, [], {}):
        with pytest.raises(NothingComparedError, match="transcript: nothing to compare: the golden has no transcript"):
            compare_json("transcript", "transcript", value, value)
    assert compare_json("t", "t", [], [], allow_empty=True).passed


def test_a_longer_in_tree_trajectory_fails_the_logits_gates() -> None:
    """Equal lengths, not at least: extra in-tree rows are a wrong tensor even when every
    judged row is identical."""
    rng = np.random.default_rng(0)
    golden = record(rng.standard_normal((3, 5)).astype(np.float32), [1, 2, 3])
    longer = record(np.concatenate([golden.logits, golden.logits[:1]]), [1, 2, 3, 1])
    result = compare_steps("decode_logits", golden, longer, golden.decode_rows())
    assert not result.passed and "in-tree produced 4 logits rows, the oracle 3" in result.summary
    assert not compare_tokens("greedy_tokens", golden, longer).passed
    assert compare_steps("decode_logits", golden, golden, golden.decode_rows()).passed
    # Every shared row identical: the runs part where the oracle stopped; nothing to localize.
    assert result.first_bad_step == 3 and result.details["shared_rows_identical"], result
    assert "the 2 judged rows both made are bit-identical: the runs part at row 3, where the oracle stopped" in (
        result.summary
    )
    shorter = compare_steps("decode_logits", longer, golden, longer.decode_rows())
    assert not shorter.passed and shorter.first_bad_step == 3 and "where the in-tree run stopped" in shorter.summary


def test_a_trajectory_that_diverged_and_ran_on_is_explained_at_its_first_differing_row() -> None:
    """Unequal row counts fail, and when a shared row differs that row is the failure explained
    (step, element, ULP) and the one localized, not the row where the lengths part."""
    rng = np.random.default_rng(1)
    golden = record(rng.standard_normal((4, 5)).astype(np.float32), [1, 2, 3, 4])
    logits = np.concatenate([golden.logits, golden.logits[:2]])
    logits[2, 3] = np.nextafter(logits[2, 3], np.float32(np.inf))
    diverged = record(logits, [1, 2, 3, 4, 1, 2])
    result = compare_steps("decode_logits", golden, diverged, golden.decode_rows())
    assert not result.passed and result.first_bad_step == 2, result
    assert result.summary.startswith(
        "wrong tensor: in-tree produced 6 logits rows, the oracle 4; first differing step 2"
    )
    diff = result.details["first_step_diff"]
    assert diff["first_index"] == 3 and diff["max_ulp"] == 1 and diff["n_differing"] == 1
    assert result.details["rows"] == {"oracle": 4, "in_tree": 6} and "shared_rows_identical" not in result.details
