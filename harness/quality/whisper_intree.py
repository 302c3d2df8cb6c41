"""The in-tree side of a Whisper quality pair: the in-tree Whisper (models/whisper, which never
imports mlx_whisper) runs what the oracle ran, the harness computes the same figures from its
logits (harness/quality/whisper_metrics.py), and the two sets are compared bit for bit.

Per fixture: the control's free run, the candidate's free run and the candidate teacher-forced
on the in-tree control's decode calls (its windows, temperatures, tokens and decisions:
harness/runners/whisper_record.py `forced`). Compared with the oracle's record: every control logits row
(sha256 of its raw bits), every forced candidate row, the per-step KL (float32 bits), both
argmax arrays, both transcripts and both token lists. The first difference is named: fixture,
what, step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from harness.errors import InTreeLoadError
from harness.quality.whisper_metrics import argmax_per_step, kl_per_step

ModelHook = Callable[[Any], None]


@dataclass(frozen=True)
class InTreeFigures:
    """What the in-tree runtime computed for one fixture (the oracle's record has the same)."""

    control_text: str
    candidate_text: str
    control_tokens: list[int]
    candidate_tokens: list[int]
    control_row_sha256: list[str]
    forced_row_sha256: list[str]
    kl: np.ndarray  # float32
    control_top1: np.ndarray
    candidate_top1: np.ndarray


def _digests(rows: np.ndarray) -> list[str]:
    return [hashlib.sha256(np.ascontiguousarray(row, dtype=np.float32).tobytes()).hexdigest() for row in rows]


class InTreePair:
    """The control and candidate loaded by the in-tree loader, each once."""

    def __init__(self, control_dir: Path, candidate_dir: Path, candidate_hook: ModelHook | None = None):
        self.control_dir, self.candidate_dir = control_dir, candidate_dir
        self.control = self._load(control_dir, None)
        self.candidate = self._load(candidate_dir, candidate_hook)
        self._features: dict[tuple[int, str, tuple[int, ...]], Any] = {}  # encoder outputs by (model, window)

    @staticmethod
    def _load(model_dir: Path, hook: ModelHook | None) -> Any:
        from models.whisper.load import load_model

        try:
            model = load_model(model_dir)  # float32: quality runs with fp16=False (checked by the caller)
        except (ValueError, FileNotFoundError) as e:
            raise InTreeLoadError(f"in-tree whisper cannot load {model_dir}: {e}") from None
        if hook is not None:
            hook(model)
        return model

    def _decode_reusing_features(self) -> Callable[..., Any]:
        """models.whisper.decoding.decode, handed each window's encoder output when this model
        has already encoded that Mel window (the decoder then skips the encoder, as mlx-whisper's
        does for given features): the candidate's forced run reuses its free run's encoder
        passes, as the oracle's does. The same call computes them, so the same bits."""
        import mlx.core as mx

        from models.whisper.decoding import decode

        def decode_fn(model: Any, segment: mx.array, *args: Any, **kwargs: Any) -> Any:
            key = (id(model), hashlib.sha256(np.array(segment).tobytes()).hexdigest(), tuple(segment.shape))
            if key not in self._features:
                features = model.embed_audio(segment[None])[0]
                mx.eval(features)
                self._features[key] = features
            return decode(model, self._features[key], *args, **kwargs)

        return decode_fn

    def figures(self, audio: Path, options: dict[str, Any]) -> InTreeFigures:
        from harness.runners.whisper_record import transcribe_record

        decode_fn = self._decode_reusing_features()
        control = transcribe_record(self.control, self.control_dir, audio, options, decode_fn=decode_fn)
        candidate = transcribe_record(self.candidate, self.candidate_dir, audio, options, decode_fn=decode_fn)
        forced = transcribe_record(
            self.candidate, self.candidate_dir, audio, options, forced=control["decode_calls"], decode_fn=decode_fn
        )
        control_rows, forced_rows = np.asarray(control["logits"]), np.asarray(forced["logits"])
        same_shape = control_rows.shape == forced_rows.shape
        kl = kl_per_step(control_rows, forced_rows) if same_shape and len(control_rows) else np.zeros(0, np.float32)
        return InTreeFigures(
            control_text=control["transcript"]["text"],
            candidate_text=candidate["transcript"]["text"],
            control_tokens=[int(t) for t in control["tokens"]],
            candidate_tokens=[int(t) for t in candidate["tokens"]],
            control_row_sha256=_digests(control_rows),
            forced_row_sha256=_digests(forced_rows),
            kl=kl,
            control_top1=argmax_per_step(control_rows) if len(control_rows) else np.zeros(0, np.int64),
            candidate_top1=argmax_per_step(forced_rows) if len(forced_rows) else np.zeros(0, np.int64),
        )


def _first_difference(a: list[Any], b: list[Any]) -> str | None:
    """Where two per-step sequences first differ: 'step i', or their lengths; None when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"step {i}"
    if len(a) != len(b):
        return f"{len(a)} steps in-tree, {len(b)} in the oracle"
    return None


def compare(fixture: str, intree: InTreeFigures, oracle: dict[str, Any]) -> str:
    """'equal' when every figure's raw bits agree, else 'differs: <fixture>: <what> <where>'
    (the first difference, in the order the figures are computed)."""
    kl_bits = intree.kl.astype(np.float32).view(np.uint32).tolist()
    oracle_kl_bits = np.asarray(oracle["kl"], np.float32).view(np.uint32).tolist()
    checks = [
        ("control logits", intree.control_row_sha256, oracle["control"]["row_sha256"]),
        ("control tokens", intree.control_tokens, oracle["control"]["tokens"]),
        ("candidate teacher-forced logits", intree.forced_row_sha256, oracle["candidate"]["forced_row_sha256"]),
        ("KL", kl_bits, oracle_kl_bits),
        ("control argmax", intree.control_top1.tolist(), np.asarray(oracle["control_top1"]).tolist()),
        ("candidate argmax", intree.candidate_top1.tolist(), np.asarray(oracle["candidate_top1"]).tolist()),
        ("candidate free-run tokens", intree.candidate_tokens, oracle["candidate"]["tokens"]),
    ]
    for what, ours, theirs in checks:
        where = _first_difference(ours, theirs)
        if where is not None:
            return f"differs: {fixture}: {what} at {where}"
    for what, ours, theirs in (
        ("control transcript", intree.control_text, oracle["control"]["text"]),
        ("candidate transcript", intree.candidate_text, oracle["candidate"]["text"]),
    ):
        if ours != theirs:
            return f"differs: {fixture}: {what}: in-tree {ours!r}, oracle {theirs!r}"
    return "equal"
