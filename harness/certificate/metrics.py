"""What the conversion certificate measures per step: the converted model (the mlx oracle's
logits on the converted weights) against the original format's own runtime on the original
file, both teacher-forced on the same tokens.

Per logits row: KL(p_oracle || p_runtime) in float64 over log-softmax (the runtime's
distribution as an approximation of the reference's), whether the two argmaxes agree (top-1),
and the largest |logit difference|. The runtime's own logit processors may set entries to the
lowest float even at teacher-forced positions (CTranslate2's timestamp rules: it returns
processed logits); those entries, and only those, are left out on both sides and counted
(`masked`). Any other -inf or NaN on either side makes the KL infinite: never a pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepMetrics:
    kl: float
    top1: bool
    max_abs: float
    masked: int = 0

    def as_list(self) -> list[float | bool | int]:
        return [self.kl, self.top1, self.max_abs, self.masked]


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float64)
    shifted = rows - rows.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


MASKED = -1e30  # at or below: an entry the runtime's processors set to the lowest float


def step_metrics(reference: np.ndarray, runtime: np.ndarray) -> list[StepMetrics]:
    """One StepMetrics per row of two (rows, vocab) logits arrays of the same shape."""
    if reference.shape != runtime.shape:
        raise ValueError(f"logits of shape {runtime.shape}, expected the reference's {reference.shape}")
    out = []
    for ref, run in zip(reference.astype(np.float64), runtime.astype(np.float64), strict=True):
        keep = ~(run <= MASKED)
        ref, run = ref[keep], run[keep]
        log_p, log_q = _log_softmax(ref), _log_softmax(run)
        p = np.exp(log_p)
        with np.errstate(invalid="ignore"):
            kl = float(np.where(p > 0, p * (log_p - log_q), 0.0).sum())
        kl = kl if np.isfinite(kl) else float("inf")
        max_abs = float(np.abs(ref - run).max())
        out.append(StepMetrics(kl, bool(ref.argmax() == run.argmax()), max_abs, int((~keep).sum())))
    return out


def worst(steps: list[StepMetrics]) -> dict[str, float]:
    """The figures a bound is set on: the largest KL and |logit difference|, the top-1 agreement."""
    return {
        "max_kl": max(s.kl for s in steps),
        "max_abs": max(s.max_abs for s in steps),
        "top1_agreement": sum(s.top1 for s in steps) / len(steps),
    }
