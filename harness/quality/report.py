"""A model's quality results as a rich table, a JSON document and the pairwise comparisons of
candidates that share a control (read from the results alone, never recomputed)."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict
from typing import Any

from rich.table import Table

from harness.quality.metrics import Comparison, LLMSummary, WhisperSummary, compare_candidates
from harness.quality.run import PairResult


def comparisons(results: list[PairResult]) -> list[Comparison]:
    """Every two language-model candidates of one control measured on the same positions."""
    out = []
    llm = [r for r in results if isinstance(r.summary, LLMSummary) and r.measurement is not None]
    for i, a in enumerate(llm):
        for b in llm[i + 1 :]:
            same_control = a.control.provenance == b.control.provenance
            assert a.measurement is not None and b.measurement is not None
            same_positions = a.measurement.window_starts == b.measurement.window_starts and (
                a.measurement.arrays["kl"].shape == b.measurement.arrays["kl"].shape
            )
            if same_control and same_positions:
                out.append(
                    compare_candidates(a.pair.id, a.measurement.arrays["kl"], b.pair.id, b.measurement.arrays["kl"])
                )
    return out


def tokens_per_second(result: PairResult) -> dict[str, dict[str, float]]:
    """Forward tokens/s per side: the oracle's run and the in-tree cross-check's."""
    positions = result.summary.positions if isinstance(result.summary, LLMSummary) else 0
    out: dict[str, dict[str, float]] = {}
    for who, seconds in (
        ("oracle", result.measurement.forward_seconds if result.measurement else {}),
        ("in-tree", result.cross_check.forward_seconds),
    ):
        out[who] = {side: positions / s for side, s in seconds.items() if s > 0 and positions}
    return out


def pair_json(r: PairResult) -> dict[str, Any]:
    return {
        "id": r.pair.id,
        "oracle": r.oracle,
        "control": {"label": r.control.label, "ran": r.control.ran, "identity": r.control.provenance.get("identity")},
        "candidate": {
            "label": r.candidate.label,
            "ran": r.candidate.ran,
            "identity": r.candidate.provenance.get("identity"),
            "kv": r.pair.candidate.kv.spec() if r.pair.candidate.kv else None,
        },
        "ran": r.ran,
        "settings": r.settings,
        "summary": r.summary.as_dict(),
        "cross_check": r.cross_check.as_dict(),
        "source": r.source,
        "quality": None if r.quality is None else {"status": r.quality.status, "reasons": r.quality.reasons},
        "thresholds": None if r.pair.thresholds is None else asdict(r.pair.thresholds),
        "tokens_per_second": tokens_per_second(r),
        "fixtures": [
            {
                "fixture": f.fixture,
                "steps": int(len(f.kl)),
                "control_text": f.control_text,
                "candidate_text": f.candidate_text,
                "word_errors": int(f.word_errors),
                "reference_words": int(f.reference_words),
                "cross_check": f.cross_check,
            }
            for f in r.fixtures
        ],
    }


def document(model: str, device: dict[str, Any], results: list[PairResult], commit: str) -> dict[str, Any]:
    return {
        "kind": "quality",
        "note": "quantization quality against a control: not part of any parity verdict; the in-tree "
        "cross-check below is parity (a difference is a parity failure)",
        "model": model,
        "device": device,
        "harness_commit": commit,
        "generated": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "pairs": [pair_json(r) for r in results],
        "comparisons": [c.as_dict() for c in comparisons(results)],
    }


def _ci(e: Any) -> str:
    return f"{e.value:.2e} [{e.low:.1e}, {e.high:.1e}]"


def table(model: str, results: list[PairResult]) -> Table:
    t = Table(title=f"quality: {model} (not part of the parity verdict)", title_justify="left")
    columns = ("pair", "candidate", "ran", "positions", "mean KL ± SE", "median [95% CI]", "p95 [95% CI]")
    columns += ("p99 [95% CI]", "max KL", "top-1 ± SE", "PPL control", "PPL candidate", "PPL ratio [95% CI]")
    for column in columns + ("cross-check", "source", "quality"):
        t.add_column(column, overflow="fold")
    for r in results:
        s = r.summary
        k = s.kl
        if isinstance(s, LLMSummary):
            positions = f"{s.positions} ({s.quantized_positions} on quantized KV)"
            ratio = s.ppl_ratio
            ppl = (
                s.ppl_control.text(".3f"),
                s.ppl_candidate.text(".3f"),
                f"{ratio.value:.4f} [{ratio.low:.4f}, {ratio.high:.4f}]",
            )
        else:
            assert isinstance(s, WhisperSummary)
            positions = f"{s.steps} steps, {s.fixtures} fixtures"
            ppl = ("—", "—", f"WER {s.wer:.4f} ({s.word_errors}/{s.reference_words})")
        quality = "—" if r.quality is None else r.quality.status
        if r.quality is not None and r.quality.reasons:
            quality += f": {'; '.join(r.quality.reasons)}"
        t.add_row(
            r.pair.id,
            r.candidate.label,
            r.ran,
            positions,
            k.mean.text(".3e"),
            _ci(k.median),
            _ci(k.p95),
            _ci(k.p99),
            f"{k.max:.3e}",
            s.top1_agreement.text(".4f"),
            *ppl,
            r.cross_check.line(),
            r.source,
            quality,
        )
    return t


def comparisons_table(items: list[Comparison]) -> Table:
    t = Table(title="candidates of one control, paired: mean KL(a) - mean KL(b)", title_justify="left")
    for column in ("a", "b", "difference ± SE", "larger than 2 SE"):
        t.add_column(column)
    for c in items:
        t.add_row(c.a, c.b, f"{c.diff:.3e} ± {c.se:.1e}", "yes" if c.distinguishable else "no (within noise)")
    return t
