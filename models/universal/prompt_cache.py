"""The per-layer cache list a decode loop holds (mlx-lm's prompt cache): `Cache`, what each
entry may be, and `maybe_quantize_kv_cache`, mlx-lm's rule (generate.py) that quantizes the
entries after every model call.
"""

from __future__ import annotations

from models.universal.cache import KVCache
from models.universal.quantized_cache import QuantizedKVCache
from models.universal.rotating_cache import RotatingKVCache

Cache = KVCache | QuantizedKVCache | RotatingKVCache


def maybe_quantize_kv_cache(
    caches: list[Cache], quantized_kv_start: int, kv_group_size: int, kv_bits: int | None
) -> None:
    """mlx-lm's rule, run after every model call: each cache that can be quantized and holds
    `quantized_kv_start` positions or more is replaced (in the list) by its quantized copy."""
    if kv_bits is None:
        return
    for i, cache in enumerate(caches):
        if hasattr(cache, "to_quantized") and cache.offset >= quantized_kv_start:
            caches[i] = cache.to_quantized(group_size=kv_group_size, bits=kv_bits)
