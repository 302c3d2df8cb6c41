"""The check table's dispatch (harness/checks/registry.py) on synthetic records: a check is
judged by its record comparison or its session judge (a VAD check by neither), a compact golden
is decided by its digests only when they settle it (anything else fetches the full vectors), the
compiled decode loop needs every row and then every token, and an unknown name is an error."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from harness.checks import registry
from harness.checks.compare import CheckResult, diff_vectors
from harness.errors import HarnessError
from harness.records import CompactLogits, ScenarioRecord, array_sha256

VOCAB = 16


def _record(n: int = 4, seed: int = 1) -> ScenarioRecord:
    """A free run of `n` greedy steps over a 16-token vocabulary, with an encoder output."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n, VOCAB)).astype(np.float32)
    return ScenarioRecord(
        "s",
        None,
        [1, 2],
        [int(t) for t in logits.argmax(axis=1)],
        logits,
        [0],
        arrays={"encoder": rng.standard_normal((3, 5)).astype(np.float32)},
    )


def _compact(full: ScenarioRecord) -> ScenarioRecord:
    """`full` as a compact golden: row hashes instead of logits, the encoder by its digest."""
    return dataclasses.replace(
        full,
        logits=np.zeros((0, VOCAB), np.float32),
        arrays={},
        compact=CompactLogits.of(full.logits, top_k=5, full_steps=0),
        array_digests={"encoder": array_sha256(full.arrays["encoder"])},
    )


class _Full:
    """The `full()` callback of judge_pair: the full golden, counting its calls."""

    def __init__(self, record: ScenarioRecord):
        self.record, self.calls = record, 0

    def __call__(self) -> ScenarioRecord:
        self.calls += 1
        return self.record


def test_an_unknown_check_name_is_an_error_listing_the_known_ones() -> None:
    """`get` refuses a name the table lacks and says which exist."""
    with pytest.raises(HarnessError, match=r"unknown check 'decode_logit'; known: \[.*'decode_logits'"):
        registry.get("decode_logit")


def test_a_session_check_is_not_judged_as_a_record_pair() -> None:
    """judge_pair refuses a check without a record comparison (the writers judge runs)."""
    golden = _record()
    with pytest.raises(HarnessError, match=r"check 'writers' judges session runs, not one record pair"):
        registry.judge_pair("writers", golden, golden, lambda: golden)


def test_a_vad_check_has_no_scenario_judge() -> None:
    """A per-fixture VAD check named on a scenario is an error, not a silent pass."""
    context = SimpleNamespace(golden=lambda: pytest.fail("no record is read"))
    with pytest.raises(HarnessError, match=r"check 'input' is judged per fixture by the VAD gate"):
        registry.get("input").judge(context)


def test_a_session_check_is_decided_by_its_judge_over_runs() -> None:
    """A check without a record comparison hands the whole context to its `judge_runs`."""
    seen = []
    verdict = CheckResult("streamed_transcript", False, "the stream dropped a window")
    check = dataclasses.replace(registry.get("streamed_transcript"), judge_runs=lambda c: seen.append(c) or verdict)
    context = SimpleNamespace(golden=lambda: pytest.fail("a session judge reads what it needs itself"))
    assert check.judge(context) is verdict
    assert seen == [context]


def test_the_compiled_decode_passes_only_with_every_row_and_token_equal() -> None:
    """Identical rows and tokens pass, and the summary names the compiled step."""
    golden = _record()
    result = registry.get("compiled_decode").compare(golden, dataclasses.replace(golden))
    assert result.passed
    assert result.summary == "4 steps bit-identical (compiled single-token decode step)"


def test_the_compiled_decode_fails_on_tokens_when_every_row_is_equal() -> None:
    """Bit-identical rows do not excuse a different token: the token comparison decides."""
    golden = _record()
    actual = dataclasses.replace(golden, tokens=[*golden.tokens[:2], (golden.tokens[2] + 1) % VOCAB, golden.tokens[3]])
    result = registry.get("compiled_decode").compare(golden, actual)
    assert not result.passed and result.check == "compiled_decode"
    assert result.first_bad_step == 2
    assert result.summary.startswith("token trajectories diverge at step 2")


def test_rows_of_another_vocabulary_are_judged_on_the_full_vectors() -> None:
    """A compact golden cannot settle logits of the wrong width: the full comparison names it."""
    full = _record()
    fetch = _Full(full)
    narrow = dataclasses.replace(full, logits=full.logits[:, :8].copy())
    result = registry.judge_pair("decode_logits", _compact(full), narrow, fetch)
    assert fetch.calls == 1
    assert not result.passed and result.check == "decode_logits"


def test_rows_of_the_golden_width_are_decided_by_their_hashes() -> None:
    """The contrast: equal rows against the compact golden pass without the full vectors."""
    full = _record()
    result = registry.judge_pair("decode_logits", _compact(full), dataclasses.replace(full), _Full(full))
    assert result.passed and result.details["decided_by"] == "sha256"
    assert result.summary.startswith("3 steps bit-identical (sha256")


def test_an_array_equal_to_its_digest_passes_without_the_blob() -> None:
    """An encoder output whose raw bits hash to the golden's digest passes by the hash alone."""
    full = _record()
    result = registry.judge_pair("encoder_output", _compact(full), dataclasses.replace(full), _Full(None))
    assert result == CheckResult("encoder_output", True, "encoder (3x5) bit-identical (sha256 of raw bits)")


def test_an_array_off_its_digest_is_judged_on_the_full_blob() -> None:
    """One ULP off the digest fetches the full golden, and the full comparison fails it."""
    full = _record()
    encoder = full.arrays["encoder"].copy()
    encoder[1, 2] = np.nextafter(encoder[1, 2], np.float32(np.inf))
    fetch = _Full(full)
    result = registry.judge_pair(
        "encoder_output", _compact(full), dataclasses.replace(full, arrays={"encoder": encoder}), fetch
    )
    assert fetch.calls == 1
    assert not result.passed and result.check == "encoder_output"


def test_an_array_whose_blob_is_at_hand_is_compared_in_full() -> None:
    """A compact golden that still holds the blob is not decided by digest (None: compare in full)."""
    full = _record()
    golden = dataclasses.replace(_compact(full), arrays=dict(full.arrays))
    assert registry.decide_by_digest(registry.get("encoder_output"), golden, dataclasses.replace(full)) is None


def test_a_diff_of_equal_vectors_explains_itself_as_bit_identical() -> None:
    """VectorDiff.explain on equal vectors counts the elements; unequal ones name the difference."""
    row = np.arange(6, dtype=np.float32)
    assert diff_vectors(row, row.copy()).explain() == "all 6 elements bit-identical"
    other = row.copy()
    other[4] = np.nextafter(other[4], np.float32(np.inf))
    assert diff_vectors(row, other).explain().startswith("1/6 elements differ")
