"""Faults of `make mutants` on paths branch coverage named (issue 53).

The L2 rotating quantized KV cache (models/universal/composed/caches.py): a multi-token write
after the first (chunked prefill) and the ring's growth at the first decode step after a short
prompt, paths that l2-rotating-quantized-kv (one prefill write of a prompt longer than the
window) never walked; each passes that scenario and is killed by the scenario added for it.

The compiled decode loop's kept cache (models/universal/compiled_kv.py: store_back), walked by
no gate while compiled_decode ran single-turn scenarios only; killed on cache-reuse's turns. The
"blocks" compiled variant (compiled_step.py), which no scenario picked before `compiled_variant`;
killed on smollm2-135m's chat."""

from __future__ import annotations

import contextlib
from typing import Any

from harness.tools.mutant_faults import Mutant, _setattr


def append_first() -> contextlib.AbstractContextManager[None]:
    """A multi-token write (a prefill chunk after the first) puts its new positions before the
    positions already in the ring instead of after them."""
    import mlx.core as mx

    from models.universal.composed.caches import RotatingQuantizedKVCache

    def _trim(self: Any, trim_size: int, v: Any, append: Any = None) -> Any:
        if trim_size > 0:
            parts = [[x[..., : self.keep, :] for x in v], [x[..., trim_size + self.keep :, :] for x in v]]
        else:
            parts = [v]
        if append is not None:
            parts.insert(0, append)  # the fault: parts.append(append) in-tree
        if len(parts) == 1:
            return parts[0]
        return [mx.concatenate(arrays, axis=2) for arrays in zip(*parts, strict=True)]

    return _setattr(RotatingQuantizedKVCache, "_trim", _trim)


def growth_prepended() -> contextlib.AbstractContextManager[None]:
    """The ring grown at the first decode step with the new block put before the prefilled
    positions instead of after them."""
    import mlx.core as mx

    from models.universal.composed.caches import RotatingQuantizedKVCache

    grow = RotatingQuantizedKVCache._update_in_place

    def _update_in_place(self: Any, keys: Any, values: Any) -> Any:
        start = self.offset
        if self.keys is not None and start >= self._length() and self._length() < self.max_size:
            batch, n_kv_heads, _, k_dim = keys.shape
            new_size = min(self.step, self.max_size - start)
            new_k = self._empty(batch, n_kv_heads, new_size, k_dim, keys.dtype)
            new_v = self._empty(batch, n_kv_heads, new_size, values.shape[3], values.dtype)
            # the fault: [old, new] in-tree
            self.keys = [mx.concatenate([b, a], axis=2) for a, b in zip(self.keys, new_k, strict=True)]
            self.values = [mx.concatenate([b, a], axis=2) for a, b in zip(self.values, new_v, strict=True)]
            self._idx = start
        return grow(self, keys, values)

    return _setattr(RotatingQuantizedKVCache, "_update_in_place", _update_in_place)


L2_CACHE_MUTANTS = [
    Mutant("l2-rotating-append-first", "a prefill chunk written before the positions already in the quantized ring",
           "minicpm5-2b-mini", "l2-rotating-quantized-kv-chunked", patch=append_first),
    Mutant("l2-rotating-grow-order", "the quantized ring grown with its new block before the prefilled positions",
           "minicpm5-2b-mini", "l2-rotating-quantized-kv-short", patch=growth_prepended),
]  # fmt: skip


def store_back_one_short() -> contextlib.AbstractContextManager[None]:
    """The compiled loop hands a kept cache back with the last decoded position's keys and
    values zeroed: the next chat turn attends to a blank position (compiled_kv.store_back)."""
    import mlx.core as mx

    import models.universal.compiled as compiled  # imports store_back by name

    store_back = compiled.store_back

    def short(cache: Any, kv: Any, offset: int) -> None:
        blank = [mx.concatenate([a[..., : offset - 1, :], mx.zeros_like(a[..., offset - 1 :, :])], axis=2) for a in kv]
        store_back(cache, blank, offset)  # the fault: kv as it is in-tree

    return _setattr(compiled, "store_back", short)


def blocks_attend_past_only() -> contextlib.AbstractContextManager[None]:
    """The "blocks" compiled step attends to the cached positions without the one it just
    wrote (the keys and values update_and_fetch returns, one short)."""
    import mlx.core as mx

    from models.universal.compiled_step import CompiledDecoder, attend

    def step_in_cache(self: Any, token: Any, cache: Any) -> Any:
        offset = mx.array(cache[0].offset, dtype=mx.int32)
        h, queries, keys, values = self._block_first(token, offset)
        for i, layer in enumerate(self.model.layers):
            keys, values = cache[i].update_and_fetch(keys, values)
            if keys.shape[2] > 1:  # the fault: keys and values as update_and_fetch returns them in-tree
                keys, values = keys[..., :-1, :], values[..., :-1, :]
            following = self._block_nexts[i](h, attend(layer, queries, keys, values, None), offset)
            if i + 1 < len(self.model.layers):
                h, queries, keys, values = following
        logits, token = following
        return logits, token

    return _setattr(CompiledDecoder, "step_in_cache", step_in_cache)


COMPILED_MUTANTS = [
    Mutant("compiled-store-back", "the compiled loop hands the kept cache back with its last position blank",
           "minicpm5-2b-mini", "cache-reuse", patch=store_back_one_short),
    Mutant("compiled-blocks-past-only", "the blocks compiled step attends without the position it just wrote",
           "smollm2-135m", "chat", patch=blocks_attend_past_only),
]  # fmt: skip
