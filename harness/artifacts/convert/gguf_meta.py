"""Reading GGUF metadata values (the converter's and the tokenizer's), a missing one named."""

from __future__ import annotations

from typing import Any

import mlx.core as mx


def meta_value(meta: dict[str, Any], key: str) -> Any:
    """A metadata value as plain Python (mx scalars become int/float/bool)."""
    value = meta[key]
    if isinstance(value, mx.array):
        return value.item() if value.ndim == 0 else value.tolist()
    return value


def require(meta: dict[str, Any], key: str) -> Any:
    if key not in meta:
        raise ValueError(f"GGUF metadata lacks required key {key!r}")
    return meta_value(meta, key)


def optional(meta: dict[str, Any], key: str, default: Any = None) -> Any:
    return meta_value(meta, key) if key in meta else default
