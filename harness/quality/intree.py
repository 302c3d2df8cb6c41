"""The in-tree cross-check of a language-model pair: the universal Llama (models/universal) runs
the oracle's windows on the same schedule and caches, the per-token metrics are computed from its
logits with the oracle's MLX op sequence (written here, not imported from mlx-lm), and every
array, digest and token id must equal the oracle's bit for bit; a difference is a parity
failure naming the pair, the window and the position."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from harness.quality.records import ARRAY_DTYPES, Measurement, TokenArrays

CacheFactory = tuple[Callable[[Any], list[Any]], Callable[[list[Any]], None]]


def kl_div_loss(logits_q: mx.array, logits_p: mx.array) -> mx.array:
    """KL(p || q) per row, as mlx_lm.tuner.losses.kl_div_loss computes it off Metal: MLX's
    nn.losses.kl_div_loss of the two log-softmaxes (on Metal mlx-lm runs its own kernel)."""
    return nn.losses.kl_div_loss(
        logits_q - mx.logsumexp(logits_q, axis=-1, keepdims=True),
        logits_p - mx.logsumexp(logits_p, axis=-1, keepdims=True),
        axis=-1,
        reduction="none",
    )


def token_metrics(control: mx.array, candidate: mx.array, targets: mx.array) -> list[mx.array]:
    """The oracle's sequence (oracles/common/lm_quality.py): KL, both NLLs, both argmaxes."""
    out = [
        kl_div_loss(candidate, control),
        nn.losses.cross_entropy(control, targets, reduction="none"),
        nn.losses.cross_entropy(candidate, targets, reduction="none"),
        mx.argmax(control, axis=-1),
        mx.argmax(candidate, axis=-1),
    ]
    mx.eval(out)
    return out


def candidate_caches(kv: dict[str, Any] | None) -> CacheFactory:
    """The in-tree caches of a KV setting (its `spec()`), built and converted as the oracle's."""
    from models.universal.prompt_cache import maybe_quantize_kv_cache
    from models.universal.rotating_cache import RotatingKVCache

    if kv is None:
        return (lambda model: model.make_cache()), (lambda cache: None)
    if kv["kind"] == "quantized":
        return (lambda model: model.make_cache()), (
            lambda cache: maybe_quantize_kv_cache(cache, kv["quantized_kv_start"], kv["group_size"], kv["bits"])
        )
    if kv["kind"] == "rotating":
        return (lambda model: [RotatingKVCache(kv["max_kv_size"], kv["keep"]) for _ in model.layers]), (
            lambda cache: None
        )
    from harness.profile.quality import KVSetting
    from models.universal.composed import parse_composition
    from models.universal.composed.kv_paths import converter, initial_caches

    setting = KVSetting(**{k: v for k, v in kv.items() if k != "kind"})
    composition = parse_composition(setting.composition())
    return (lambda model: initial_caches(model, composition)), converter(composition)


def _forward(model: Any, inputs: list[int], chunk: int | None, caches: CacheFactory) -> tuple[mx.array, list[bool]]:
    make_cache, after_call = caches
    cache = make_cache(model)
    step = chunk or len(inputs)
    pieces, quantized = [], []
    for start in range(0, len(inputs), step):
        piece = inputs[start : start + step]
        quantized += [any("Quantized" in type(c).__name__ for c in cache)] * len(piece)
        logits = model(mx.array(piece)[None], cache=cache)
        after_call(cache)
        mx.eval([logits] + [c.state for c in cache])
        pieces.append(logits)
    return (pieces[0] if len(pieces) == 1 else mx.concatenate(pieces, axis=1)), quantized


def _sha256(x: mx.array) -> str:
    return hashlib.sha256(np.array(mx.contiguous(x).view(mx.uint8)).tobytes()).hexdigest()


def encode_corpus(model_dir: Path, text: str) -> list[int]:
    from models.universal import ChatTokenizer

    return ChatTokenizer.from_dir(model_dir).encode(text, add_special_tokens=False)


def measure_intree(
    control_dir: Path,
    candidate_dir: Path,
    kv: dict[str, Any] | None,
    ids: list[int],
    window_starts: list[int],
    context: int,
    chunk: int | None,
    model_hook: Callable[[Any], None] | None = None,
    on_window: Callable[[int, int], None] | None = None,
) -> Measurement:
    """The in-tree side of the pair over the given windows (`model_hook` perturbs the candidate
    model, as the parity tests do, to show the cross-check failing)."""
    from models.universal import load_model

    control_model, _ = load_model(control_dir)
    candidate_model = control_model if candidate_dir == control_dir else load_model(candidate_dir)[0]
    if model_hook is not None:
        if candidate_model is control_model:
            candidate_model = load_model(candidate_dir)[0]
        model_hook(candidate_model)
    plain: CacheFactory = ((lambda model: model.make_cache()), (lambda cache: None))
    caches = candidate_caches(kv)
    per_window: dict[str, list[np.ndarray]] = {name: [] for name in ARRAY_DTYPES}
    digests, seconds = [], {"control": 0.0, "candidate": 0.0}
    dtypes: dict[str, str] = {}
    for w, start in enumerate(window_starts):
        window = ids[start : start + context]
        inputs, targets = window[:-1], mx.array(window[1:])[None]
        began = time.perf_counter()
        control, _ = _forward(control_model, inputs, chunk, plain)
        seconds["control"] += time.perf_counter() - began
        began = time.perf_counter()
        candidate, quantized = _forward(candidate_model, inputs, chunk, caches)
        seconds["candidate"] += time.perf_counter() - began
        digests.append({"control": _sha256(control), "candidate": _sha256(candidate)})
        dtypes = {
            "control": str(control.dtype).removeprefix("mlx.core."),
            "candidate": str(candidate.dtype).removeprefix("mlx.core."),
        }
        values = token_metrics(control.astype(mx.float32), candidate.astype(mx.float32), targets)
        for name, value in zip(list(ARRAY_DTYPES)[:5], values, strict=True):
            per_window[name].append(np.array(value).reshape(-1))
        per_window["quantized"].append(np.array(quantized, dtype=bool))
        per_window["targets"].append(np.array(window[1:], dtype=np.int32))
        del control, candidate
        mx.clear_cache()
        if on_window is not None:
            on_window(w + 1, len(window_starts))
    arrays = TokenArrays({name: np.stack(v).astype(ARRAY_DTYPES[name]) for name, v in per_window.items()})
    return Measurement(
        arrays=arrays,
        window_starts=list(window_starts),
        logits_sha256=digests,
        corpus_ids_sha256=ids_sha256(ids),
        n_corpus_tokens=len(ids),
        forward_seconds=seconds,
        logits_dtype=dtypes,
    )


def ids_sha256(ids: list[int]) -> str:
    return hashlib.sha256(np.array(ids, dtype=np.int32).tobytes()).hexdigest()


@dataclass(frozen=True)
class CrossCheck:
    status: str  # "equal" | "differs" | "not run"
    detail: str
    forward_seconds: dict[str, float]

    def line(self) -> str:
        return self.status if self.status == "equal" else f"{self.status}: {self.detail}"

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.detail, "forward_seconds": self.forward_seconds}


def compare(oracle: Measurement, intree: Measurement, skip: tuple[str, ...] = ()) -> CrossCheck:
    """Bit for bit: corpus ids, windows, each window's logits digests, then every per-token
    array; the first difference is named (window, position, both values)."""
    seconds = intree.forward_seconds

    def differs(detail: str) -> CrossCheck:
        return CrossCheck("differs", detail, seconds)

    if oracle.corpus_ids_sha256 != intree.corpus_ids_sha256:
        return differs(
            f"the corpus tokens differ ({oracle.n_corpus_tokens} oracle vs {intree.n_corpus_tokens} in-tree ids)"
        )
    if oracle.window_starts != intree.window_starts:
        return differs("the windows differ")
    for w, (a, b) in enumerate(zip(oracle.logits_sha256, intree.logits_sha256, strict=True)):
        for side in ("control", "candidate"):
            if a[side] != b[side]:
                detail = _first_array_difference(oracle.arrays, intree.arrays, skip, only_window=w)
                return differs(
                    f"window {w}: {side} logits sha256 {b[side][:12]}… is not the oracle's {a[side][:12]}…; {detail}"
                )
    detail = _first_array_difference(oracle.arrays, intree.arrays, skip)
    if detail:
        return differs(detail)
    note = f" ({', '.join(skip)} not compared)" if skip else ""
    return CrossCheck(
        "equal", f"{oracle.arrays.n_positions} positions, {len(oracle.window_starts)} windows{note}", seconds
    )


def _first_array_difference(
    a: TokenArrays, b: TokenArrays, skip: tuple[str, ...], only_window: int | None = None
) -> str:
    for name in ARRAY_DTYPES:
        if name in skip:
            continue
        x, y = a[name], b[name]
        if only_window is not None:
            x, y = x[only_window : only_window + 1], y[only_window : only_window + 1]
        if x.shape != y.shape:
            return f"{name}: shape {y.shape} is not the oracle's {x.shape}"
        itemsize = x.dtype.itemsize
        xb = np.ascontiguousarray(x).view(np.uint8).reshape(x.shape + (itemsize,))
        yb = np.ascontiguousarray(y).view(np.uint8).reshape(y.shape + (itemsize,))
        unequal = np.argwhere((xb != yb).any(axis=-1))
        if len(unequal):
            w, p = int(unequal[0][0]), int(unequal[0][1])
            w_report = w if only_window is None else only_window
            count = len(unequal)
            values = f"oracle {x[w, p]!r}, in-tree {y[w, p]!r}"
            return f"{name}: window {w_report} position {p}: {values} ({count} positions differ)"
    return ""
