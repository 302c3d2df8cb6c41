"""The compiled decode step is the eager loop, bit for bit, and the comparison that says so bites.

The eager `greedy_steps` is gated bit-exact against mlx-lm by the goldens; here the compiled
loop is held to it in raw bits (logits as uint32, tokens, the kept cache's buffers), on the
MiniCPM5 mini twin in float32 across a 256-position buffer growth and in bfloat16, and to the
mlx-lm goldens themselves through the session's own checks. Each perturbation (RoPE offset
off by one inside the trace; the attention softmax without `precise`) must be caught.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
import pytest

import models.universal.compiled as compiled
import models.universal.compiled_step as compiled_step
from harness.session import ParitySession
from harness.tools.bench_compiled import gate
from models.universal import UniversalLlama, greedy_steps, load_model
from models.universal.compiled import DecodeReport, compiled_greedy_steps

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("minicpm5-2b-mini")]

FP32, BF16 = "minicpm5-2b-mini", "minicpm5-2b-mini-bf16"
# 250 prompt positions + 10 steps: the KVCache's first 256-position block fills mid-decode.
LONG_PROMPT = list(range(300, 550))


@pytest.fixture(scope="module")
def session() -> ParitySession:
    return ParitySession()


@pytest.fixture(scope="module")
def mini(session: ParitySession) -> UniversalLlama:
    return load_model(session.artifact(session.profile(FP32)).model_dir)[0]


@pytest.fixture(scope="module")
def mini_bf16(session: ParitySession) -> UniversalLlama:
    return load_model(session.artifact(session.profile(BF16)).model_dir)[0]


def bits(steps: list[Any]) -> tuple[np.ndarray, list[int]]:
    """Every step's logits as raw uint32 bits (bf16 widens to f32 exactly), and the tokens."""
    return np.stack([np.array(s.logits.astype(mx.float32)).view(np.uint32) for s in steps]), [s.token for s in steps]


def differing_steps(expected: list[Any], actual: list[Any]) -> list[int]:
    (e_bits, e_tokens), (a_bits, a_tokens) = bits(expected), bits(actual)
    assert e_bits.shape == a_bits.shape
    return [i for i in range(len(e_bits)) if not np.array_equal(e_bits[i], a_bits[i]) or e_tokens[i] != a_tokens[i]]


def test_compiled_equals_eager_across_a_buffer_growth(mini: UniversalLlama) -> None:
    report = DecodeReport()
    eager = list(greedy_steps(mini, LONG_PROMPT, 10))
    fast = list(compiled_greedy_steps(mini, LONG_PROMPT, 10, report=report))
    assert report.compiled and report.variant == ("split" if mx.default_device() == mx.cpu else "whole")
    assert differing_steps(eager, fast) == []


def test_kept_cache_forcing_and_teacher_forcing_match_eager(mini: UniversalLlama) -> None:
    """Two turns on one kept cache (the first crossing the 256 block), a forced prefix on the
    second, teacher forcing on both: steps and the cache left behind equal in bits."""
    turns = [(LONG_PROMPT, 10, None), ([5, 17, 42], 4, [300, 1])]
    sides = {}
    for name, loop in (("eager", greedy_steps), ("compiled", compiled_greedy_steps)):
        cache = mini.make_cache()
        steps = []
        for prompt, n, prefix in turns:
            steps += list(
                loop(mini, prompt, n, forced_tokens=list(range(700, 700 + n)), forced_prefix=prefix, cache=cache)
            )
        sides[name] = steps, cache
    (eager, eager_cache), (fast, fast_cache) = sides["eager"], sides["compiled"]
    assert differing_steps(eager, fast) == []
    assert [s.token for s in fast[10:12]] == [300, 1]
    for e, c in zip(eager_cache, fast_cache, strict=True):
        assert c.offset == e.offset == len(LONG_PROMPT) + 10 + 3 + 4
        for e_array, c_array in ((e.keys, c.keys), (e.values, c.values)):
            assert c_array.shape == e_array.shape  # the same 256-position blocks
            assert np.array_equal(np.array(e_array).view(np.uint32), np.array(c_array).view(np.uint32))


def test_one_token_prompt_starts_from_an_empty_cache(mini: UniversalLlama) -> None:
    assert differing_steps(list(greedy_steps(mini, [5], 3)), list(compiled_greedy_steps(mini, [5], 3))) == []


def test_compiled_equals_eager_in_bfloat16(mini_bf16: UniversalLlama) -> None:
    prompt = LONG_PROMPT[:20]
    eager = list(greedy_steps(mini_bf16, prompt, 4))
    assert differing_steps(eager, list(compiled_greedy_steps(mini_bf16, prompt, 4))) == []
    assert mini_bf16.layers[0].input_layernorm.weight.dtype == mx.bfloat16


def test_compiled_passes_the_mlx_lm_goldens(session: ParitySession) -> None:
    """The L1 step gates, compiled, against the oracle's goldens (a chat and a forced EOS)."""
    rows = gate(session, session.profile(FP32), "auto", ["think-default", "eos-im-end"])
    judged = {"prefill_logits", "decode_logits", "teacher_forced_logits", "greedy_tokens", "eos_stop"}
    assert {r["check"] for r in rows} == judged, rows
    assert all(r["passed"] for r in rows), [r for r in rows if not r["passed"]]
    assert all(not any(ran.startswith("eager") for ran in r["ran"]) for r in rows), rows


@pytest.mark.skipif(mx.default_device() != mx.cpu, reason="only the CPU backend's rope slices")
def test_whole_step_is_refused_on_the_cpu_so_auto_splits(mini: UniversalLlama, fresh_traces: None) -> None:
    """Why "split" exists: the CPU rope falls back to slices, which no shapeless trace takes."""
    with pytest.raises(ValueError, match="cannot infer output shapes"):
        list(compiled_greedy_steps(mini, [5, 6], 2, variant="whole"))


def test_unsupported_cache_kinds_run_the_eager_loop(mini: UniversalLlama) -> None:
    report = DecodeReport()
    fast = list(compiled_greedy_steps(mini, [5, 6, 7], 2, max_kv_size=8, report=report))
    assert not report.compiled and "max_kv_size" in report.reasons[0]
    assert differing_steps(list(greedy_steps(mini, [5, 6, 7], 2, max_kv_size=8)), fast) == []


def test_each_eager_only_cache_is_named_and_a_quantized_cache_decodes_eagerly(mini: UniversalLlama) -> None:
    """The fallbacks no gate reaches (compiled_decode is scoped away from kv_bits and
    max_kv_size scenarios, harness/checks/scope.py; coverage-exempt.yaml names this test)."""
    from models.universal.cache import KVCache
    from models.universal.quantized_cache import QuantizedKVCache

    assert compiled.eager_only_reasons(None, None, None) == []
    assert compiled.eager_only_reasons(None, None, [KVCache()]) == []
    assert compiled.eager_only_reasons(8, None, None) == ["kv_bits: the quantized KV cache decodes eagerly"]
    assert compiled.eager_only_reasons(None, None, [QuantizedKVCache()]) == [
        "cache: a kept cache other than plain KVCaches decodes eagerly"
    ]
    report = DecodeReport()
    fast = list(compiled_greedy_steps(mini, [5, 6, 7], 2, kv_bits=8, report=report))
    assert not report.compiled and "kv_bits" in report.reasons[0]
    assert differing_steps(list(greedy_steps(mini, [5, 6, 7], 2, kv_bits=8)), fast) == []
    assert list(compiled_greedy_steps(mini, [5, 6, 7], 0)) == []  # nothing asked, nothing compiled


def test_bad_arguments_are_refused_like_greedy_steps(mini: UniversalLlama) -> None:
    with pytest.raises(ValueError, match="variant: expected one of"):
        list(compiled_greedy_steps(mini, [5], 2, variant="fast"))
    with pytest.raises(ValueError, match="forced_tokens: 1 given, 2 needed"):
        list(compiled_greedy_steps(mini, [5], 3, forced_tokens=[7]))
    with pytest.raises(ValueError, match="prompt_ids: need at least one token"):
        list(compiled_greedy_steps(mini, [], 3))


# -- perturbations: each one must be caught ----------------------------------------------------


@pytest.fixture
def fresh_traces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Perturbed traces go into an empty decoder table, dropped afterwards."""
    monkeypatch.setattr(compiled_step, "_decoders", {})


def test_rope_offset_off_by_one_in_the_trace_is_caught(
    session: ParitySession, mini: UniversalLlama, monkeypatch: pytest.MonkeyPatch, fresh_traces: None
) -> None:
    rope = compiled_step.apply_rope
    monkeypatch.setattr(compiled_step, "apply_rope", lambda layer, q, k, offset: rope(layer, q, k, offset + 1))
    prompt = LONG_PROMPT[:12]
    assert differing_steps(list(greedy_steps(mini, prompt, 3)), list(compiled_greedy_steps(mini, prompt, 3))) == [
        0,
        1,
        2,
    ]
    # and the golden gate fails on it too (its model is the session runner's, traced afresh)
    rows = gate(session, session.profile(FP32), "auto", ["eos-s"])
    failed = {r["check"] for r in rows if not r["passed"]}
    assert {"prefill_logits", "decode_logits", "teacher_forced_logits"} <= failed, rows


def test_imprecise_attention_softmax_is_caught_in_bfloat16(
    mini_bf16: UniversalLlama, monkeypatch: pytest.MonkeyPatch, fresh_traces: None
) -> None:
    """The same attention written out with softmax(precise=False): in float32 `precise` changes
    nothing (an equivalent change), in bfloat16 it drops the float32 accumulation."""

    def imprecise(layer, queries, keys, values, mask):
        batch, n_heads, length, dim = queries.shape
        n_kv = keys.shape[1]
        queries = (queries * layer.self_attn.scale).reshape(batch, n_kv, n_heads // n_kv, length, dim)
        scores = queries @ mx.expand_dims(keys, 2).swapaxes(-1, -2)
        weights = mx.softmax(scores, axis=-1, precise=False)
        return (weights @ mx.expand_dims(values, 2)).reshape(batch, n_heads, length, dim)

    monkeypatch.setattr(compiled_step, "attend", imprecise)
    prompt = LONG_PROMPT[:20]
    eager = list(greedy_steps(mini_bf16, prompt, 3))
    assert differing_steps(eager, list(compiled_greedy_steps(mini_bf16, prompt, 3))) != []


# -- compiled_decode through the session (issue 15 part 2) ------------------------------------


def _think_default(session: ParitySession):
    profile = session.profile(FP32)
    return profile, next(s for s in profile.scenarios if s.id == "think-default")


def test_compiled_decode_check_fails_through_the_session_on_a_perturbed_trace(
    monkeypatch: pytest.MonkeyPatch, fresh_traces: None
) -> None:
    session = ParitySession()
    profile, scenario = _think_default(session)
    assert session.run_check(profile, scenario, "compiled_decode").passed
    session = ParitySession()
    rope = compiled_step.apply_rope
    monkeypatch.setattr(compiled_step, "_decoders", {})
    monkeypatch.setattr(compiled_step, "apply_rope", lambda layer, q, k, offset: rope(layer, q, k, offset + 1))
    result = session.run_check(profile, scenario, "compiled_decode")
    assert not result.passed and result.first_bad_step is not None, result.summary


def test_a_compiled_decode_that_falls_back_to_the_eager_loop_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.errors import InTreeRunError

    monkeypatch.setattr(compiled, "eager_only_reasons", lambda *a: ["a cache kind not compiled (test)"])
    session = ParitySession()
    profile, scenario = _think_default(session)
    with pytest.raises(InTreeRunError, match="fell back to the eager loop .a cache kind not compiled"):
        session.run_check(profile, scenario, "compiled_decode")


def test_the_compiled_run_is_checked_for_determinism(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.errors import NonDeterministicError
    from harness.runners.llama import LlamaRunner

    run, calls = LlamaRunner.run, []

    def flaky(self, spec, forced=None, decode="eager"):
        record = run(self, spec, forced=forced, decode=decode)
        calls.append(decode)
        if decode == "compiled" and calls.count("compiled") == 2:
            record.logits = record.logits.copy()
            record.logits[3, 7] = np.nextafter(record.logits[3, 7], np.float32(np.inf))
        return record

    monkeypatch.setattr(LlamaRunner, "run", flaky)
    session = ParitySession()
    profile, scenario = _think_default(session)
    with pytest.raises(NonDeterministicError):
        session.run_check(profile, scenario, "compiled_decode")
