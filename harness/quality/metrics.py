"""Summaries of per-token quality arrays, in numpy float64, each figure with its uncertainty.

- KL(control || candidate): mean with its standard error (sd / sqrt(n), as llama.cpp's
  `llama-perplexity --kl-divergence` reports "Mean KLD ± SE"); median, p95 and p99 with
  seeded bootstrap 95% intervals (resampling positions, `N_BOOTSTRAP` times, numpy's linear
  percentile); max.
- Top-1 agreement: the share of positions whose argmax is the same, with the binomial standard
  error sqrt(p (1 - p) / n) (llama.cpp's "Same top p").
- Perplexity of each side: exp(mean NLL) with mlx-lm's eval_ppl standard error, the delta
  approximation ppl * sd(NLL) / sqrt(n) (sd with ddof=1).
- Their ratio PPL(candidate) / PPL(control): exp of the mean paired difference of NLL per
  position, its interval exp(mean ± 1.96 SE) of that paired mean (the delta method on the log
  scale, as llama.cpp's "Mean ln(PPL(Q)/PPL(base))"); the ratio's SE is ratio * SE.
- Two candidates of one control, on the same positions: the paired difference of their mean KL
  with its SE; "distinguishable" when |difference| > 2 SE.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

N_BOOTSTRAP = 1000
BOOTSTRAP_SEED = 20
PERCENTILES = {"median": 50.0, "p95": 95.0, "p99": 99.0}
Z95 = 1.959963984540054


@dataclass(frozen=True)
class Estimate:
    value: float
    se: float | None = None
    low: float | None = None  # a 95% interval, where one is given
    high: float | None = None

    def as_dict(self) -> dict[str, float | None]:
        return asdict(self)

    def text(self, fmt: str = ".4g") -> str:
        if self.se is not None:
            return f"{self.value:{fmt}} ± {self.se:{fmt}}"
        if self.low is not None and self.high is not None:
            return f"{self.value:{fmt}} [{self.low:{fmt}}, {self.high:{fmt}}]"
        return f"{self.value:{fmt}}"


def _f64(x: np.ndarray) -> np.ndarray:
    out = np.asarray(x, dtype=np.float64).reshape(-1)
    if out.size == 0:
        raise ValueError("no positions to summarize")
    return out


def mean_se(x: np.ndarray) -> Estimate:
    x = _f64(x)
    se = float(np.std(x, ddof=1) / math.sqrt(x.size)) if x.size > 1 else float("nan")
    return Estimate(float(np.mean(x)), se)


def bootstrap_percentiles(x: np.ndarray, seed: int = BOOTSTRAP_SEED, n_boot: int = N_BOOTSTRAP) -> dict[str, Estimate]:
    """Each percentile of PERCENTILES with the 2.5/97.5 percentiles of its bootstrap distribution."""
    x = _f64(x)
    qs = list(PERCENTILES.values())
    rng = np.random.Generator(np.random.PCG64(seed))
    draws = np.empty((n_boot, len(qs)))
    batch = max(1, min(n_boot, 4_000_000 // x.size))
    for start in range(0, n_boot, batch):
        stop = min(start + batch, n_boot)
        idx = rng.integers(0, x.size, size=(stop - start, x.size))
        draws[start:stop] = np.percentile(x[idx], qs, axis=1).T
    point = np.percentile(x, qs)
    low, high = np.percentile(draws, [2.5, 97.5], axis=0)
    return {
        name: Estimate(float(point[i]), low=float(low[i]), high=float(high[i])) for i, name in enumerate(PERCENTILES)
    }


def agreement(control_top1: np.ndarray, candidate_top1: np.ndarray) -> Estimate:
    a, b = np.asarray(control_top1).reshape(-1), np.asarray(candidate_top1).reshape(-1)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"top-1 arrays: expected two equal non-empty shapes, got {a.shape} and {b.shape}")
    p = float(np.mean(a == b))
    return Estimate(p, math.sqrt(p * (1.0 - p) / a.size))


def perplexity(nll: np.ndarray) -> Estimate:
    """mlx-lm's eval_ppl: exp(mean loss), SE ppl * sd(loss, ddof=1) / sqrt(n)."""
    m = mean_se(nll)
    ppl = math.exp(m.value)
    return Estimate(ppl, ppl * m.se)


def perplexity_ratio(control_nll: np.ndarray, candidate_nll: np.ndarray) -> Estimate:
    d = mean_se(_f64(candidate_nll) - _f64(control_nll))
    ratio = math.exp(d.value)
    return Estimate(ratio, ratio * d.se, math.exp(d.value - Z95 * d.se), math.exp(d.value + Z95 * d.se))


@dataclass(frozen=True)
class KLSummary:
    n: int
    mean: Estimate
    median: Estimate
    p95: Estimate
    p99: Estimate
    max: float

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n": self.n, "max": self.max}
        for name in ("mean", "median", "p95", "p99"):
            out[name] = getattr(self, name).as_dict()
        return out


class _FieldsAsDicts:
    """as_dict: the summary's fields in their order, a nested Estimate or KLSummary by its as_dict (None stays None)."""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.as_dict() if isinstance(value, (Estimate, KLSummary)) else value
        return out


def kl_summary(kl: np.ndarray) -> KLSummary:
    x = _f64(kl)
    p = bootstrap_percentiles(x)
    return KLSummary(x.size, mean_se(x), p["median"], p["p95"], p["p99"], float(np.max(x)))


@dataclass(frozen=True)
class LLMSummary(_FieldsAsDicts):
    positions: int
    quantized_positions: int  # positions whose candidate call attended to a quantized cache
    kl: KLSummary
    kl_quantized_mean: Estimate | None  # mean KL over those positions only
    top1_agreement: Estimate
    ppl_control: Estimate
    ppl_candidate: Estimate
    ppl_ratio: Estimate


def summarize_llm(arrays: Any) -> LLMSummary:
    """Summaries of a language-model pair's TokenArrays (harness/quality/records.py)."""
    quantized = np.asarray(arrays["quantized"]).reshape(-1)
    kl = _f64(arrays["kl"])
    return LLMSummary(
        positions=int(kl.size),
        quantized_positions=int(quantized.sum()),
        kl=kl_summary(kl),
        kl_quantized_mean=mean_se(kl[quantized]) if quantized.sum() > 1 else None,
        top1_agreement=agreement(arrays["control_top1"], arrays["candidate_top1"]),
        ppl_control=perplexity(arrays["control_nll"]),
        ppl_candidate=perplexity(arrays["candidate_nll"]),
        ppl_ratio=perplexity_ratio(arrays["control_nll"], arrays["candidate_nll"]),
    )


@dataclass(frozen=True)
class WhisperSummary(_FieldsAsDicts):
    steps: int
    fixtures: int
    kl: KLSummary
    top1_agreement: Estimate
    wer: float
    word_errors: int
    reference_words: int


def summarize_whisper(fixtures: list[Any]) -> WhisperSummary:
    """Per-step KL and agreement concatenated over the fixtures; WER = sum of word errors over
    sum of reference words (the control's transcript is the reference)."""
    if not fixtures:
        raise ValueError("no fixtures to summarize")
    kl = np.concatenate([_f64(f.kl) for f in fixtures])
    agree = np.concatenate([np.asarray(f.top1_agree, dtype=bool).reshape(-1) for f in fixtures])
    errors = sum(int(f.word_errors) for f in fixtures)
    words = sum(int(f.reference_words) for f in fixtures)
    p = float(agree.mean())
    return WhisperSummary(
        steps=int(kl.size),
        fixtures=len(fixtures),
        kl=kl_summary(kl),
        top1_agreement=Estimate(p, math.sqrt(p * (1 - p) / agree.size)),
        wer=errors / words if words else float("nan"),
        word_errors=errors,
        reference_words=words,
    )


@dataclass(frozen=True)
class Comparison:
    """Two candidates of one control on the same positions: is their mean-KL gap above noise?"""

    a: str
    b: str
    diff: float  # mean KL(a) - mean KL(b)
    se: float
    distinguishable: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_candidates(a: str, kl_a: np.ndarray, b: str, kl_b: np.ndarray) -> Comparison:
    x, y = _f64(kl_a), _f64(kl_b)
    if x.shape != y.shape:
        raise ValueError(f"{a} and {b} were measured on other positions ({x.size} vs {y.size}): no paired comparison")
    d = mean_se(x - y)
    return Comparison(a, b, d.value, d.se, bool(abs(d.value) > 2 * d.se))
