"""The known faults of `make mutants`: each one plausible bug in an in-tree implementation (a
config slip, one ULP in one weight, a dropped decoding rule...), applied in process by a model
hook, a monkeypatch or an edited scenario spec (harness/tools/mutants.py lists and runs them)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import mlx.core as mx
import numpy as np


def _one_ulp_up(array: mx.array) -> mx.array:
    """The first element moved one ULP towards +inf in the array's own dtype (float32, float16 or
    bfloat16, which numpy lacks): on the raw bits, as np.nextafter does it for float32."""
    unsigned = {2: mx.uint16, 4: mx.uint32}[array.itemsize]
    bits = np.array(array.view(unsigned))
    sign = 1 << (8 * array.itemsize - 1)
    first = int(bits.flat[0])
    if first & ~sign == 0:  # +0 or -0: the smallest positive subnormal
        bits.flat[0] = 1
    else:  # a positive value grows away from zero, a negative one shrinks towards it
        bits.flat[0] = first - 1 if first & sign else first + 1
    return mx.array(bits).view(array.dtype)


@dataclass
class Mutant:
    name: str
    fault: str  # what the bug is, in words
    model: str
    scenario: str
    hook: Callable[[Any], None] | None = None  # applied to the loaded in-tree model
    patch: Callable[[], contextlib.AbstractContextManager[None]] | None = None  # code-level fault
    spec_edits: dict[str, Any] = field(default_factory=dict)  # scenario-level fault (options)
    # The same fault judged on other models (`--model`): model -> its scenario for this mutant,
    # e.g. a float32 mutant's half-precision twins, where rounding may make it visible.
    on: dict[str, str] = field(default_factory=dict)
    # Filled by a run (harness/tools/mutants.py): check -> the declared paths its scenario walked.
    walked: dict[str, list[str]] = field(default_factory=dict, compare=False)

    def models(self) -> list[str]:
        return [self.model, *self.on]

    def judged_on(self, model: str | None) -> Mutant:
        """This mutant on `model`'s scenario for it (None: its own model)."""
        if model is None or model == self.model:
            return self
        if model not in self.on:
            raise KeyError(f"mutant {self.name} has no scenario on {model} (it has: {', '.join(self.models())})")
        return replace(self, model=model, scenario=self.on[model], on={}, walked={})


@contextlib.contextmanager
def _setattr(target: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, old)


def all_norm_eps(model: Any) -> None:
    for layer in model.model.layers:
        layer.input_layernorm.eps = layer.post_attention_layernorm.eps = 1e-6
    model.model.norm.eps = 1e-6


def final_norm_eps(model: Any) -> None:
    """The final RMSNorm alone with an eps ten times smaller (another model's value: 1e-5 -> 1e-6 on
    SmolLM2). Every backend adds eps in float32 (MLX's RMSNorm accumulates in float32 whatever the
    activation dtype), so the change shows only where eps moves mean(x^2) + eps: hidden states
    whose mean square is below about eps * 2^24."""
    model.model.norm.eps = model.model.norm.eps / 10


def rope_base(model: Any) -> None:
    import mlx.nn as nn

    for layer in model.model.layers:
        rope = layer.self_attn.rope
        layer.self_attn.rope = nn.RoPE(
            rope.dims, traditional=rope.traditional, base=rope.base * 1.0001, scale=rope.scale
        )


def attention_scale(model: Any) -> None:
    for layer in model.model.layers:
        layer.self_attn.scale = np.float32(layer.self_attn.scale) * np.float32(1.0001)


def swap_gate_up(model: Any) -> None:
    mlp = model.model.layers[3].mlp
    mlp.gate_proj, mlp.up_proj = mlp.up_proj, mlp.gate_proj


def skip_final_norm(model: Any) -> None:
    model.model.norm.weight = model.model.norm.weight * 0 + 1  # a norm without its learned scale


def ulp_layer_norm(model: Any) -> None:
    layers = model.model.layers
    norm = layers[min(17, len(layers) - 1)].post_attention_layernorm  # the last of a shallower model
    norm.weight = _one_ulp_up(norm.weight)


def drop_eos(runner_cls: Any) -> contextlib.AbstractContextManager[None]:
    from models.universal.tokenizer import ChatTokenizer

    original = ChatTokenizer.eos_token_ids

    def fewer(self: Any) -> frozenset[int]:
        return frozenset(sorted(original.fget(self))[:-1])

    return _setattr(ChatTokenizer, "eos_token_ids", property(fewer))


def template_space() -> contextlib.AbstractContextManager[None]:
    from models.universal.tokenizer import ChatTokenizer

    original = ChatTokenizer.render_chat_like_mlx_lm

    def render(self: Any, *args: Any, **kwargs: Any) -> str:
        return original(self, *args, **kwargs).replace("assistant\n", "assistant \n")

    return _setattr(ChatTokenizer, "render_chat_like_mlx_lm", render)


def fresh_cache_each_turn() -> contextlib.AbstractContextManager[None]:
    import models.universal as universal

    def turns(model: Any, turn_prompts: list[list[int]], n_tokens: int, *, forced_tokens=None, **options: Any):
        forced = forced_tokens or [None] * len(turn_prompts)
        return [
            list(universal.greedy_steps(model, ids, n_tokens, forced_tokens=f, **options))
            for ids, f in zip(turn_prompts, forced, strict=True)
        ]

    return _setattr(universal, "chat_turn_steps", turns)


def mel_nudge() -> contextlib.AbstractContextManager[None]:
    import models.whisper.transcribe as transcribe

    original = transcribe.log_mel_spectrogram

    def nudged(*args: Any, **kwargs: Any) -> mx.array:
        mel = original(*args, **kwargs)
        return mel + mx.zeros(mel.shape).at[5, 3].add(1e-3)

    return _setattr(transcribe, "log_mel_spectrogram", nudged)


def no_timestamp_rules() -> contextlib.AbstractContextManager[None]:
    import models.whisper.logit_filters as logit_filters

    return _setattr(logit_filters.ApplyTimestampRules, "apply", lambda self, logits, tokens: logits)


def whisper_encoder_ulp(model: Any) -> None:
    model.encoder.ln_post.weight = _one_ulp_up(model.encoder.ln_post.weight)


def whisper_decoder_ulp(model: Any) -> None:
    model.decoder.ln.weight = _one_ulp_up(model.decoder.ln.weight)


def compiled_rope_offset() -> contextlib.AbstractContextManager[None]:
    """A fault in the compiled decode trace only: RoPE one position ahead (the eager loop is right)."""
    import models.universal.compiled_step as compiled_step

    rope = compiled_step.apply_rope
    stack = contextlib.ExitStack()
    stack.enter_context(_setattr(compiled_step, "_decoders", {}))  # traced afresh, dropped afterwards
    stack.enter_context(
        _setattr(compiled_step, "apply_rope", lambda layer, q, k, offset: rope(layer, q, k, offset + 1))
    )
    return stack


def no_logprob_fallback() -> contextlib.AbstractContextManager[None]:
    import models.whisper.seek_loop as seek_loop

    original = seek_loop.needs_fallback
    return _setattr(
        seek_loop, "needs_fallback", lambda result, ratio, logprob, no_speech: original(result, ratio, None, no_speech)
    )


def ranker_without_length_norm() -> contextlib.AbstractContextManager[None]:
    import models.whisper.token_decoders as token_decoders

    def rank(self: Any, tokens: list, sum_logprobs: list) -> list[int]:
        return [int(np.argmax(group)) for group in sum_logprobs]

    return _setattr(token_decoders.MaximumLikelihoodRanker, "rank", rank)


def patience_ignored() -> contextlib.AbstractContextManager[None]:
    import models.whisper.token_decoders as token_decoders

    original = token_decoders.BeamSearchDecoder.__init__

    def init(self: Any, beam_size: int, eot: int, inference: Any, patience: float | None = None) -> None:
        original(self, beam_size, eot, inference, patience)
        self.max_candidates = beam_size  # as if patience were 1

    return _setattr(token_decoders.BeamSearchDecoder, "__init__", init)


def one_candidate_short() -> contextlib.AbstractContextManager[None]:
    import models.whisper.token_decoders as token_decoders

    original = token_decoders.BeamSearchDecoder.top_candidates

    def top(self: Any, logits: mx.array, sum_logprobs: mx.array) -> tuple[list, list]:
        ids, scores = original(self, logits, sum_logprobs)
        return [row[:-1] for row in ids], [row[:-1] for row in scores]  # beam_size, not beam_size + 1

    return _setattr(token_decoders.BeamSearchDecoder, "top_candidates", top)


def segment_end_one_step_late() -> contextlib.AbstractContextManager[None]:
    import models.whisper.seek_loop as seek_loop

    original = seek_loop.split_segments

    def split(*args: Any, **kwargs: Any) -> Any:
        window = original(*args, **kwargs)
        for segment in window.segments:
            segment["end"] = round(segment["end"] + 0.02, 2)  # one timestamp step
        return window

    return _setattr(seek_loop, "split_segments", split)


def subtitle_line_one_wider() -> contextlib.AbstractContextManager[None]:
    import models.whisper.writers as writers

    original = writers._pack_subtitles

    def one_wider(segments: Any, *, max_line_width: int, **kwargs: Any) -> Any:
        return original(segments, max_line_width=max_line_width + 1, **kwargs)

    return _setattr(writers, "_pack_subtitles", one_wider)


def fast_logits_scaled() -> contextlib.AbstractContextManager[None]:
    from models.whisper.fast_model import FastWhisper

    original = FastWhisper._logits
    return _setattr(FastWhisper, "_logits", lambda self, x: original(self, x) * 1.01)


def fast_attention_scale_ulp() -> contextlib.AbstractContextManager[None]:
    from models.whisper.fast_model import FastWhisper

    original = FastWhisper.__init__

    def init(self: Any, model: Any) -> None:
        original(self, model)
        for name in ("audio_attention_scale", "text_attention_scale"):
            setattr(self, name, float(np.nextafter(np.float32(getattr(self, name)), np.float32(np.inf))))

    return _setattr(FastWhisper, "__init__", init)


class _SoftmaxNotPrecise:
    """`mlx.core` as one module sees it, except that softmax drops `precise=True` (MLX then
    accumulates a float16 / bfloat16 softmax in that dtype; in float32 the flag changes nothing)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(mx, name)

    @staticmethod
    def softmax(a: mx.array, axis: Any = None, *, precise: bool = False, **kwargs: Any) -> mx.array:
        return mx.softmax(a, axis=axis, **kwargs)


def imprecise_softmax() -> contextlib.AbstractContextManager[None]:
    """The attention softmax without `precise=True`, in the two in-tree attentions that spell their
    softmax out, as their references do with precise=True: Whisper's (mlx-whisper's
    MultiHeadAttention) and the LLM's quantized-KV attention (mlx-lm's
    quantized_scaled_dot_product_attention). Plain LLM attention is mx.fast's fused SDPA on both
    sides, whose softmax precision is MLX's own choice, not the implementation's."""
    import models.universal.model as llama
    import models.whisper.model as whisper

    stack = contextlib.ExitStack()
    for module in (llama, whisper):
        stack.enter_context(_setattr(module, "mx", _SoftmaxNotPrecise()))
    return stack


def dequantize_then_fused_sdpa() -> contextlib.AbstractContextManager[None]:
    """Quantized KV attended by dequantizing K and V and calling the fused
    mx.fast.scaled_dot_product_attention, instead of mlx-lm's quantized attention
    (quantized_matmul scores, precise softmax, quantized_matmul): the same math, other kernels."""
    import models.universal.model as llama

    def attend(
        queries: mx.array, q_keys: Any, q_values: Any, scale: float, mask: Any, group_size: int, bits: int
    ) -> mx.array:
        keys = mx.dequantize(*q_keys, group_size=group_size, bits=bits)
        values = mx.dequantize(*q_values, group_size=group_size, bits=bits)
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)

    return _setattr(llama, "quantized_scaled_dot_product_attention", attend)


def draft_rewind_ignores_accepted() -> contextlib.AbstractContextManager[None]:
    """Draft-model speculative decoding (models/universal/speculative.py): after a verify step
    that accepts some but not all drafts, the draft cache is rewound as if every draft had been
    rejected (by drafted - 1, not drafted - accepted - 1). Right when all or none are accepted,
    so only a scenario with a partial acceptance sees it (issue 31: spec-requant-*)."""
    import models.universal.speculative as speculative

    count, trim = speculative.accepted_count, speculative.trim
    step: dict[str, int] = {}

    def counted(target_tokens: list[int], draft_tokens: list[int]) -> int:
        step.update(accepted=count(target_tokens, draft_tokens), drafted=len(draft_tokens))
        return step["accepted"]

    def rewound(layer: Any, n: int) -> Any:
        accepted, drafted = step.get("accepted", 0), step.get("drafted", 0)
        if 0 < accepted < drafted and n == drafted - accepted - 1:  # the draft cache's rewind
            n = drafted - 1
        return trim(layer, n)

    stack = contextlib.ExitStack()
    stack.enter_context(_setattr(speculative, "accepted_count", counted))
    stack.enter_context(_setattr(speculative, "trim", rewound))
    return stack


def rotating_trim_off_by_one() -> contextlib.AbstractContextManager[None]:
    """The rotating cache's multi-token write into a full ring (models/universal/rotating_cache.py,
    RotatingKVCache._update_concat, through _concat_trim_size) drops one old position too few. Only a
    prefill chunk of several tokens arriving when the ring is full takes that path (issue 31:
    rotating-kv's one-chunk prefill never does; rotating-kv-chunked does)."""
    from models.universal.rotating_cache import RotatingKVCache

    def concat_trim_size(self: Any) -> int:
        return self._idx - self.max_size  # the fault: the unmutated cache adds 1

    return _setattr(RotatingKVCache, "_concat_trim_size", concat_trim_size)


def rotating_wrapped_order() -> contextlib.AbstractContextManager[None]:
    """A wrapped rotating cache put back in temporal order wrongly before a multi-token write
    (models/universal/rotating_cache.py, RotatingKVCache._temporal_order): the positions after the
    write index, the oldest, end up last. Only a write of several tokens into a ring that decoding
    has wrapped takes that path: a later turn's prompt through one cache (issue 53: found by branch
    coverage; rotating-kv and rotating-kv-chunked pass with it, rotating-kv-turns fails)."""
    import mlx.core as mx

    from models.universal.rotating_cache import RotatingKVCache

    order = RotatingKVCache._temporal_order

    def swapped(self: Any, v: Any) -> Any:
        if self._idx == v.shape[2] or self._idx >= self.offset:
            return order(self, v)
        keep, idx = self.keep, self._idx
        return mx.concatenate([v[..., :keep, :], v[..., keep:idx, :], v[..., idx:, :]], axis=2)  # the fault

    return _setattr(RotatingKVCache, "_temporal_order", swapped)


def stream_decodes_only_at_finish() -> contextlib.AbstractContextManager[None]:
    """The streaming transcriber (models/whisper/stream.py) decodes nothing while samples are
    fed, everything at finish(): the transcript is the batch run's, bit for bit, but nothing
    was streamed. Only a clip longer than a window, fed in pieces, can show it (issue 31:
    long-two-windows says it exists for `streamed_transcript: decoded before finish`)."""
    from models.whisper.stream import StreamingTranscriber

    advance = StreamingTranscriber._advance

    def at_finish_only(self: Any, *, final: bool, **kwargs: Any) -> None:
        if final:
            advance(self, final=final, **kwargs)

    return _setattr(StreamingTranscriber, "_advance", at_finish_only)
