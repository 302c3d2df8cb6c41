"""Branches of the L2 composed paths (models/universal/composed) that no gate can walk (issue 53),
each judged against what the oracle computes.

- A multi-token write into a quantized ring after single-token writes (the ring grown and not
  full, or wrapped): `_temporal_order`'s two reorderings. `composed_steps` runs one prompt, whose
  multi-token writes (prefill chunks) all come before its first single-token write, and mlx-optiq
  composes no multi-turn path, so no L2 scenario reaches them. optiq's RotatingQuantizedKVCache is
  mlx-lm's RotatingKVCache over (packed, scales, biases) triples, and mx.quantize quantizes each
  position alone, so the quantized ring must be the float ring quantized, position for position;
  the float ring (models/universal/rotating_cache.py) is gated bit for bit against mlx-lm in these
  two cases by minicpm5-2b-mini's rotating-kv-turns and rotating-kv-turns-short.
- The fused SDPA kernel on ungrouped heads (n_repeats 1): it runs on half-precision queries only,
  and the one ungrouped twin (llama-mha-mini) is float32, so its l2-fused-sdpa takes the stock
  fallback.
- Where the pinned mlx-optiq venv is built (`make parity MODEL=minicpm5-2b-mini` builds it when a
  golden is missing), both are compared bit for bit with optiq's own classes, run in that venv.
- `composed_steps` asked for no step, and a parsed composition passed through: what the harness
  never asks (steps are in [1, MAX_STEPS], compositions come from YAML as dicts).
"""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

from harness.paths import REPO_ROOT
from models.universal.composed import composed_steps, parse_composition
from models.universal.composed.caches import RotatingQuantizedKVCache
from models.universal.composed.fused_sdpa import fused_quantized_attention
from models.universal.model import quantized_scaled_dot_product_attention
from models.universal.rotating_cache import RotatingKVCache

MAX_SIZE, KEEP, GROUP, BITS = 24, 4, 64, 4

# Positions per write: a prompt, single tokens, then a multi-token write (and more of each).
SEQUENCES = {
    "grown": [10, 1, 1, 1, 5, 1, 1, 3],  # the ring grown to 24 at the first single write, not full
    "wrapped": [10] + [1] * 20 + [5] + [1] * 4 + [6],  # wrapped past `keep` before the write of 5
    "first-single": [1] * 30 + [4, 1, 7],  # the first write is a single token into an empty ring
}


def _writes(sizes: list[int], seed: int = 0) -> list[tuple[mx.array, mx.array]]:
    rng = np.random.RandomState(seed)
    return [
        tuple(mx.array(rng.standard_normal((1, 2, n, 64)).astype(np.float32)) for _ in "kv")  # type: ignore[misc]
        for n in sizes
    ]


def _quantized(x: mx.array) -> list[mx.array]:
    return list(mx.quantize(x, group_size=GROUP, bits=BITS))


def _equal(a: list[mx.array], b: list[mx.array]) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and mx.array_equal(x, y).item() for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_quantized_ring_is_the_float_ring_quantized(name: str) -> None:
    ring = RotatingQuantizedKVCache(MAX_SIZE, KEEP, group_size=GROUP, bits=BITS)
    plain = RotatingKVCache(max_size=MAX_SIZE, keep=KEEP)
    reordered = set()
    for keys, values in _writes(SEQUENCES[name]):
        if keys.shape[2] > 1 and ring.keys is not None and ring._idx != ring.keys[0].shape[2]:
            reordered.add("wrapped" if ring._idx < ring.offset else "sliced")
        q_keys, q_values = ring.update_and_fetch(keys, values)
        f_keys, f_values = plain.update_and_fetch(keys, values)
        assert (ring.offset, ring._idx) == (plain.offset, plain._idx)
        # What attention reads: every position in it was written, so it is the float window quantized.
        assert _equal(q_keys, _quantized(f_keys)) and _equal(q_values, _quantized(f_values))
    # The multi-token writes after single ones took the reordering this sequence is for.
    assert reordered == {"grown": {"sliced"}, "wrapped": {"wrapped"}, "first-single": {"wrapped"}}[name]


def _half_case(dtype: mx.Dtype, n_heads: int, length: int, n_keys: int, seed: int) -> tuple[mx.array, list, list]:
    rng = np.random.RandomState(seed)

    def draw(*shape: int) -> mx.array:
        return mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)

    keys = list(mx.quantize(draw(1, n_heads, n_keys, 64), group_size=64, bits=8))
    values = list(mx.quantize(draw(1, n_heads, n_keys, 64), group_size=64, bits=8))
    return draw(1, n_heads, length, 64), keys, values


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize(("length", "mask"), [(5, "causal"), (1, None)])
def test_fused_kernel_on_ungrouped_heads_is_attention(dtype: mx.Dtype, length: int, mask: str | None) -> None:
    """Two query heads over two KV heads, 21 keys in tiles of 8: the tiled online softmax is the
    stock quantized attention up to rounding (bit for bit optiq's: test_composed_paths_match_optiq)."""
    queries, keys, values = _half_case(dtype, 2, length, 21, seed=1)
    tiled = fused_quantized_attention(queries, keys, values, scale=0.125, mask=mask, group_size=64, bits=8, n_chunk=8)
    stock = quantized_scaled_dot_product_attention(mx.array(queries), keys, values, 0.125, mask, 64, 8)
    assert tiled.shape == queries.shape and tiled.dtype == dtype
    assert np.allclose(np.array(tiled.astype(mx.float32)), np.array(stock.astype(mx.float32)), atol=0.05)


# Run in the mlx-optiq venv (and here, through the in-tree classes): a digest per ring write and
# per fused-kernel case, over the same numpy draws as the tests above.
_PROBE = """
import hashlib, json, sys
import numpy as np
import mlx.core as mx
{imports}
SEQUENCES = json.loads(sys.argv[1])

def digest(arrays):
    d = hashlib.sha256()
    for x in arrays:
        d.update(repr(tuple(x.shape)).encode())
        d.update(np.array(mx.contiguous(x).view(mx.uint8)).tobytes())
    return d.hexdigest()

out = {{"rings": {{}}, "fused": []}}
for name, sizes in sorted(SEQUENCES.items()):
    rng = np.random.RandomState(0)
    ring, trace = Ring(24, 4, group_size=64, bits=4), []
    for n in sizes:
        k, v = (mx.array(rng.standard_normal((1, 2, n, 64)).astype(np.float32)) for _ in "kv")
        ks, vs = ring.update_and_fetch(k, v)
        state = digest([*ring.keys, *ring.values])
        trace.append([int(ring.offset), int(ring._idx), digest(list(ks) + list(vs)), state])
    out["rings"][name] = trace
for dtype in (mx.bfloat16, mx.float16):
    for length, mask in ((5, "causal"), (1, None), (16, "causal")):
        rng = np.random.RandomState(1)
        draw = lambda *shape: mx.array(rng.standard_normal(shape).astype(np.float32)).astype(dtype)
        q = draw(1, 2, length, 64)
        n_keys = max(length, 21)
        k = list(mx.quantize(draw(1, 2, n_keys, 64), group_size=64, bits=8))
        v = list(mx.quantize(draw(1, 2, n_keys, 64), group_size=64, bits=8))
        out["fused"].append(digest([fused(q, k, v, 0.125, mask)]))
print(json.dumps(out))
"""
_OPTIQ = """
import optiq.runtime.fused_quant_sdpa as f
from optiq.runtime.kv.rotating import RotatingQuantizedKVCache as Ring
f._N_CHUNK = 8
fused = lambda q, k, v, scale, mask: f._prefill_flashattn_n_tiled(q, k, v, scale, mask, 64, 8)
"""
_INTREE = """
from models.universal.composed.caches import RotatingQuantizedKVCache as Ring
from models.universal.composed.fused_sdpa import fused_quantized_attention
fused = lambda q, k, v, scale, mask: fused_quantized_attention(
    q, k, v, scale=scale, mask=mask, group_size=64, bits=8, n_chunk=8)
"""


def _optiq_command(*args: str) -> tuple[list[str], dict[str, str]] | None:
    """How to run the pinned mlx-optiq venv's interpreter, if that venv is built (never built here)."""
    from harness.oracle.venvs import OracleEnv, pins_hash, read_pins, venv_root

    pins = read_pins("mlx-optiq")
    env = OracleEnv(name="mlx-optiq", root=venv_root("mlx-optiq", pins_hash(pins)), pins_hash="", pins=pins)
    if not (env.root / ".complete").exists():
        return None
    return env.command(*args)


def _probe(command: list[str], environ: dict[str, str] | None = None) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300, cwd=REPO_ROOT, env=environ)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_composed_paths_match_optiq() -> None:
    optiq = _optiq_command("-c", _PROBE.format(imports=_OPTIQ), json.dumps(SEQUENCES))
    if optiq is None:
        pytest.skip("the pinned mlx-optiq venv is not built (make parity MODEL=minicpm5-2b-mini builds it)")
    theirs = _probe(*optiq)
    here = _probe([sys.executable, "-c", _PROBE.format(imports=_INTREE), json.dumps(SEQUENCES)])
    assert set(here["rings"]) == set(SEQUENCES) and len(here["fused"]) == 6
    assert here["rings"] == theirs["rings"]
    assert here["fused"] == theirs["fused"]


def test_no_step_asked_runs_nothing() -> None:
    """Asked for no step, nothing runs: the stand-in model has no layers and cannot be called."""
    model = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=2, attention_head_dim=64, vocab_size=100))
    for composition in ({"kind": "streaming_kv", "kv_bits": 8}, {"kind": "ngram_draft"}):
        assert list(composed_steps(model, [1, 2, 3], 0, composition)) == []  # type: ignore[arg-type]


def test_a_parsed_composition_is_taken_as_it_is() -> None:
    for raw in (
        {"kind": "mixed_kv", "kv_config": [{"layer_idx": 0, "bits": 8}]},
        {"kind": "streaming_kv", "kv_bits": 4},
        {"kind": "fused_sdpa", "kv_bits": 8, "n_chunk": 8},
        {"kind": "rotating_quantized_kv", "max_kv_size": 24, "keep": 4, "kv_bits": 4},
        {"kind": "ngram_draft", "num_draft_tokens": 4},
    ):
        parsed = parse_composition(raw)
        assert parse_composition(parsed) is parsed
        assert parsed == parse_composition(dict(raw))
