"""The quality metrics on constructed inputs: the per-token MLX op sequence the oracle and the
in-tree cross-check share (harness/quality/intree.py mirrors oracles/common/lm_quality.py), and
the float64 summaries (harness/quality/metrics.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

from harness.quality import metrics
from harness.quality.intree import token_metrics
from harness.quality.records import ARRAY_DTYPES, TokenArrays

VOCAB = 97


def _run(control: np.ndarray, candidate: np.ndarray, targets: np.ndarray) -> list[np.ndarray]:
    out = token_metrics(mx.array(control[None]), mx.array(candidate[None]), mx.array(targets[None]))
    return [np.array(x).reshape(-1) for x in out]


def _log_softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)


def test_identical_logits_give_kl_exactly_zero_and_agreement_one() -> None:
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal((40, VOCAB)) * 3).astype(np.float32)
    targets = rng.integers(0, VOCAB, 40)
    kl, nll_a, nll_b, top_a, top_b = _run(logits, logits.copy(), targets)
    assert kl.dtype == np.float32 and np.all(kl == 0.0)  # exactly, not approximately
    assert nll_a.tobytes() == nll_b.tobytes()
    assert metrics.agreement(top_a, top_b).value == 1.0
    assert metrics.agreement(top_a, top_b).se == 0.0
    summary = metrics.kl_summary(kl)
    assert summary.mean.value == 0.0 and summary.max == 0.0 and summary.p99.value == 0.0


def test_random_logit_pairs_match_a_float64_reference() -> None:
    """KL(control || candidate) and each side's NLL against numpy float64 computed another way
    (log-softmax through logaddexp.reduce, KL as sum p (log p - log q))."""
    rng = np.random.default_rng(20)
    control = (rng.standard_normal((64, VOCAB)) * 2).astype(np.float32)
    candidate = (control + rng.standard_normal((64, VOCAB)).astype(np.float32) * 0.3).astype(np.float32)
    targets = rng.integers(0, VOCAB, 64)
    kl, nll_control, nll_candidate, top_control, top_candidate = _run(control, candidate, targets)
    lp, lq = _log_softmax64(control), _log_softmax64(candidate)
    want_kl = np.sum(np.exp(lp) * (lp - lq), axis=-1)
    np.testing.assert_allclose(kl, want_kl, rtol=2e-4, atol=2e-6)
    np.testing.assert_allclose(nll_control, -lp[np.arange(64), targets], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(nll_candidate, -lq[np.arange(64), targets], rtol=1e-5, atol=1e-5)
    assert np.array_equal(top_control, control.argmax(-1)) and np.array_equal(top_candidate, candidate.argmax(-1))
    # The direction: KL(p || q) is not KL(q || p) on these inputs, and we computed the first.
    reverse = np.sum(np.exp(lq) * (lq - lp), axis=-1)
    assert not np.allclose(kl, reverse, rtol=1e-3)


@pytest.mark.parametrize("k", [0, 1, 7, 50])
def test_argmax_differing_at_exactly_k_of_n_gives_one_minus_k_over_n(k: int) -> None:
    n = 50
    rng = np.random.default_rng(k)
    control = rng.standard_normal((n, VOCAB)).astype(np.float32)
    candidate = control.copy()
    flipped = rng.choice(n, size=k, replace=False)
    for i in flipped:  # move the top token elsewhere: the argmax differs here, nowhere else
        top = int(candidate[i].argmax())
        candidate[i, (top + 1) % VOCAB] = candidate[i, top] + 1.0
    _, _, _, top_control, top_candidate = _run(control, candidate, rng.integers(0, VOCAB, n))
    got = metrics.agreement(top_control, top_candidate)
    assert got.value == 1 - k / n
    assert got.se == pytest.approx(math.sqrt(got.value * (1 - got.value) / n))


def test_perplexity_and_ratio_follow_their_definitions() -> None:
    rng = np.random.default_rng(3)
    control = rng.gamma(2.0, 1.0, 500)
    candidate = control + rng.normal(0.05, 0.02, 500)
    ppl = metrics.perplexity(control)
    assert ppl.value == pytest.approx(math.exp(control.mean()))
    assert ppl.se == pytest.approx(ppl.value * control.std(ddof=1) / math.sqrt(500))  # mlx-lm's eval_ppl
    ratio = metrics.perplexity_ratio(control, candidate)
    d = candidate - control
    assert ratio.value == pytest.approx(math.exp(d.mean()))
    assert ratio.low < ratio.value < ratio.high
    assert ratio.value == pytest.approx(metrics.perplexity(candidate).value / ppl.value)


def test_bootstrap_percentiles_are_seeded_and_cover_the_point() -> None:
    x = np.random.default_rng(4).exponential(1.0, 3000)
    a, b = metrics.bootstrap_percentiles(x), metrics.bootstrap_percentiles(x)
    assert a == b  # the same seed, the same interval
    for name, q in metrics.PERCENTILES.items():
        assert a[name].value == pytest.approx(np.percentile(x, q))
        assert a[name].low <= a[name].value <= a[name].high


def test_two_candidates_are_distinguishable_only_beyond_noise() -> None:
    rng = np.random.default_rng(5)
    base = rng.exponential(0.01, 4000)
    same = metrics.compare_candidates("a", base, "b", base + rng.normal(0, 1e-4, 4000))
    assert not same.distinguishable
    apart = metrics.compare_candidates("a", base, "b", base * 3)
    assert apart.distinguishable and apart.diff < 0
    with pytest.raises(ValueError, match="other positions"):
        metrics.compare_candidates("a", base, "b", base[:10])


def test_llm_summary_counts_quantized_positions() -> None:
    rng = np.random.default_rng(6)
    shape = (2, 10)
    arrays = {
        "kl": rng.exponential(0.01, shape).astype(np.float32),
        "control_nll": rng.exponential(2, shape).astype(np.float32),
        "candidate_nll": rng.exponential(2, shape).astype(np.float32),
        "control_top1": rng.integers(0, 5, shape).astype(np.int32),
        "candidate_top1": rng.integers(0, 5, shape).astype(np.int32),
        "quantized": np.tile(np.arange(10) >= 4, (2, 1)),
        "targets": rng.integers(0, 5, shape).astype(np.int32),
    }
    summary = metrics.summarize_llm(TokenArrays(arrays))
    assert summary.positions == 20 and summary.quantized_positions == 12
    assert summary.kl_quantized_mean.value == pytest.approx(arrays["kl"][:, 4:].astype(np.float64).mean())
    with pytest.raises(ValueError, match="kl"):
        TokenArrays(arrays | {"kl": arrays["kl"].astype(np.float64)})
    assert set(ARRAY_DTYPES) == set(arrays)


def test_whisper_summary_concatenates_fixtures_and_pools_word_errors() -> None:
    fixtures = [
        SimpleNamespace(kl=np.array([0.0, 0.1]), top1_agree=np.array([True, False]), word_errors=1, reference_words=10),
        SimpleNamespace(kl=np.array([0.2]), top1_agree=np.array([True]), word_errors=0, reference_words=5),
    ]
    s = metrics.summarize_whisper(fixtures)
    assert s.steps == 3 and s.fixtures == 2
    assert s.kl.mean.value == pytest.approx(0.1)
    assert s.top1_agreement.value == pytest.approx(2 / 3)
    assert s.wer == pytest.approx(1 / 15)  # sum of errors over sum of reference words, not a mean of ratios
