"""The "blocks" compiled step (KV written in place into the KVCache's 256-position blocks, as
mlx-lm writes it) is the eager loop, bit for bit, and the comparison bites on a perturbed trace."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest

import models.universal.compiled_step as compiled_step
from harness.session import ParitySession
from models.universal import UniversalLlama, greedy_steps, load_model
from models.universal.compiled import DecodeReport, compiled_greedy_steps

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("minicpm5-2b-mini")]

LONG_PROMPT = list(range(300, 550))  # 250 positions + 10 steps: the first 256 block fills mid-decode


@pytest.fixture(scope="module")
def session() -> ParitySession:
    return ParitySession()


@pytest.fixture(scope="module")
def mini(session: ParitySession) -> UniversalLlama:
    return load_model(session.artifact(session.profile("minicpm5-2b-mini")).model_dir)[0]


@pytest.fixture
def fresh_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled_step, "_decoders", {})


def differing_steps(expected: list[Any], actual: list[Any]) -> list[int]:
    def bits(steps: list[Any]) -> list[tuple[bytes, int]]:
        return [(np.array(s.logits.astype(mx.float32)).view(np.uint32).tobytes(), s.token) for s in steps]

    assert len(expected) == len(actual)
    return [i for i, (e, a) in enumerate(zip(bits(expected), bits(actual), strict=True)) if e != a]


def blocks(*args: Any, **kwargs: Any) -> list[Any]:
    report = DecodeReport()
    steps = list(compiled_greedy_steps(*args, variant="blocks", report=report, **kwargs))
    assert report.compiled and report.variant == "blocks"
    return steps


def test_blocks_equal_eager_across_a_buffer_growth_and_from_one_token(mini: UniversalLlama) -> None:
    assert differing_steps(list(greedy_steps(mini, LONG_PROMPT, 10)), blocks(mini, LONG_PROMPT, 10)) == []
    assert differing_steps(list(greedy_steps(mini, [5], 3)), blocks(mini, [5], 3)) == []


def test_blocks_kept_cache_forcing_and_teacher_forcing_match_eager(mini: UniversalLlama) -> None:
    turns = [(LONG_PROMPT, 10, None), ([5, 17, 42], 4, [300, 1])]
    sides = {}
    for name, loop in (("eager", lambda *a, **k: list(greedy_steps(*a, **k))), ("blocks", blocks)):
        cache, steps = mini.make_cache(), []
        for prompt, n, prefix in turns:
            steps += loop(mini, prompt, n, forced_tokens=list(range(700, 700 + n)), forced_prefix=prefix, cache=cache)
        sides[name] = steps, cache
    (eager, eager_cache), (fast, fast_cache) = sides["eager"], sides["blocks"]
    assert differing_steps(eager, fast) == []
    for e, c in zip(eager_cache, fast_cache, strict=True):
        assert c.offset == e.offset == len(LONG_PROMPT) + 10 + 3 + 4
        for e_array, c_array in ((e.keys, c.keys), (e.values, c.values)):
            assert c_array.shape == e_array.shape
            assert np.array_equal(np.array(e_array).view(np.uint32), np.array(c_array).view(np.uint32))


def test_blocks_equal_eager_in_bfloat16(session: ParitySession) -> None:
    model = load_model(session.artifact(session.profile("minicpm5-2b-mini-bf16")).model_dir)[0]
    prompt = LONG_PROMPT[:20]
    assert differing_steps(list(greedy_steps(model, prompt, 4)), blocks(model, prompt, 4)) == []


def test_rope_offset_off_by_one_in_the_blocks_trace_is_caught(
    mini: UniversalLlama, monkeypatch: pytest.MonkeyPatch, fresh_traces: None
) -> None:
    rope = compiled_step.apply_rope
    monkeypatch.setattr(compiled_step, "apply_rope", lambda layer, q, k, offset: rope(layer, q, k, offset + 1))
    prompt = LONG_PROMPT[:12]
    assert differing_steps(list(greedy_steps(mini, prompt, 3)), blocks(mini, prompt, 3)) == [0, 1, 2]


def test_a_block_write_one_position_late_is_caught(mini: UniversalLlama, monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-place write is the KVCache's own: shifted by a position, every step differs."""
    from models.universal.cache import KVCache

    update = KVCache.update_and_fetch

    def late(self: KVCache, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if keys.shape[2] == 1:
            self.offset += 1
        return update(self, keys, values)

    prompt = LONG_PROMPT[:12]
    eager = list(greedy_steps(mini, prompt, 3))
    monkeypatch.setattr(KVCache, "update_and_fetch", late)
    assert differing_steps(eager, blocks(mini, prompt, 3)) == [0, 1, 2]
