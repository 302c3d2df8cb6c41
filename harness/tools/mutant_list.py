"""The mutants of `make mutants` (harness/tools/mutants.py runs them): one plausible bug each, its
default model and scenario, and where it is judged on other models (`--model`: the
half-precision twins, where a fault that float32 rounds away may show)."""

from __future__ import annotations

from harness.tools import mutant_faults as fault
from harness.tools.mutant_faults import Mutant
from harness.tools.mutant_faults_l2 import COMPILED_MUTANTS, L2_CACHE_MUTANTS
from harness.tools.mutant_faults_rope import ROPE_MUTANTS
from harness.tools.mutant_faults_streams import STREAM_MUTANTS
from harness.tools.mutant_faults_text import TEXT_MUTANTS
from harness.tools.mutant_faults_tokens import TOKEN_MUTANTS
from harness.tools.mutant_faults_whisper import WHISPER_MUTANTS

# The half-precision twins of the mini MiniCPM5 and of Whisper large-v3-turbo, per mutant.
LLM_CHAT_TWINS = {
    "minicpm5-2b-mini": "think-off",
    "minicpm5-2b-mini-bf16": "chat-bf16",
    "minicpm5-2b-mini-fp16": "chat-fp16",
}
LLM_KV_TWINS = {"minicpm5-2b-mini-bf16": "kv8-from-prefill", "minicpm5-2b-mini-fp16": "kv8-from-prefill"}

MUTANTS = [
    Mutant("norm-eps", "every RMSNorm eps 1e-6 instead of 1e-5", "smollm2-135m", "chat", hook=fault.all_norm_eps),
    Mutant("rope-base", "rope base off by 1e-4 relative", "smollm2-135m", "chat", hook=fault.rope_base),
    Mutant(
        "attention-scale",
        "attention scale off by 1e-4 relative",
        "smollm2-135m",
        "chat",
        hook=fault.attention_scale,
    ),
    Mutant(
        "gate-up-swap",
        "MLP gate and up projections swapped in one layer",
        "smollm2-135m",
        "chat",
        hook=fault.swap_gate_up,
    ),
    Mutant(
        "final-norm-scale",
        "final norm without its learned scale",
        "smollm2-135m",
        "chat",
        hook=fault.skip_final_norm,
    ),
    Mutant(
        "one-ulp",
        "one ULP in one norm weight of layer 17 (the last layer of a shallower model)",
        "smollm2-135m",
        "chat",
        hook=fault.ulp_layer_norm,
        on=LLM_CHAT_TWINS,
    ),
    Mutant(
        "prefill-chunks",
        "prompt prefilled in one chunk where the profile says 16",
        "smollm2-135m",
        "chunked-prefill",
        spec_edits={"prefill_step_size": 2048},
    ),
    Mutant(
        "eos-dropped",
        "one of MiniCPM5's two EOS ids forgotten",
        "minicpm5-2b-mini",
        "eos-im-end",
        patch=lambda: fault.drop_eos(None),
    ),
    Mutant(
        "template-space",
        "a space after the assistant header",
        "minicpm5-2b-mini",
        "think-off",
        patch=fault.template_space,
    ),
    Mutant(
        "kv-group-size",
        "quantized KV group size 32 instead of 64",
        "minicpm5-2b-mini",
        "kv8-converts-mid-decode",
        spec_edits={"kv_group_size": 32},
    ),
    Mutant(
        "kv-start",
        "KV conversion one position late",
        "minicpm5-2b-mini",
        "kv8-converts-mid-decode",
        spec_edits={"quantized_kv_start": 41},
    ),
    Mutant(
        "rotating-window",
        "rotating window one larger",
        "minicpm5-2b-mini",
        "rotating-kv",
        spec_edits={"max_kv_size": 25},
    ),
    Mutant(
        "cache-forgotten",
        "a fresh cache for every chat turn",
        "minicpm5-2b-mini",
        "cache-reuse",
        patch=fault.fresh_cache_each_turn,
    ),
    Mutant(
        "l2-layer-bits",
        "one layer's KV bits 8 instead of 4 (mixed precision)",
        "minicpm5-2b-mini",
        "l2-mixed-kv",
        spec_edits={
            "composition": {
                "kind": "mixed_kv",
                "quantized_kv_start": 30,
                "kv_config": [
                    {"layer_idx": 0, "bits": 8, "group_size": 64},
                    {"layer_idx": 1, "bits": 8, "group_size": 64},
                    {"layer_idx": 3, "bits": 4, "group_size": 32},
                ],
            }
        },
    ),
    Mutant(
        "l2-draft-window",
        "4 drafted tokens instead of 8",
        "minicpm5-2b-mini",
        "l2-ngram-draft",
        spec_edits={"composition": {"kind": "ngram_draft", "num_draft_tokens": 4, "ngram_min": 3, "ngram_max": 3}},
    ),
    Mutant(
        "mel",
        "one log-mel value nudged by 1e-3",
        "whisper-large-v3-turbo-mini",
        "fox-detect-language",
        patch=fault.mel_nudge,
    ),
    Mutant(
        "encoder-ulp",
        "one ULP in the encoder's final norm",
        "whisper-large-v3-turbo-mini",
        "fox-detect-language",
        hook=fault.whisper_encoder_ulp,
    ),
    Mutant(
        "decoder-ulp",
        "one ULP in the decoder's final norm",
        "whisper-large-v3-turbo-mini",
        "fox-detect-language",
        hook=fault.whisper_decoder_ulp,
        on={"whisper-large-v3-turbo-fp16": "fox-english"},
    ),
    Mutant(
        "timestamp-rules",
        "the timestamp grammar filter dropped",
        "whisper-large-v3-turbo-mini",
        "fox-detect-language",
        patch=fault.no_timestamp_rules,
    ),
    Mutant(
        "compiled-rope",
        "RoPE one position ahead in the compiled decode trace only",
        "minicpm5-2b-mini",
        "think-default",
        patch=fault.compiled_rope_offset,
    ),
    Mutant(
        "fallback-logprob",
        "the log-probability fallback rule dropped",
        "whisper-large-v3-turbo-mini",
        "fox-english-ladder",
        patch=fault.no_logprob_fallback,
    ),
    Mutant(
        "beam-ranker",
        "beam candidates ranked without length normalization",
        "whisper-tiny-en",
        "message-beam5-patience",
        patch=fault.ranker_without_length_norm,
    ),
    Mutant(
        "beam-patience",
        "beam search waits for beam_size finished sequences, not beam_size x patience",
        "whisper-tiny-en",
        "message-beam5-patience",
        patch=fault.patience_ignored,
    ),
    Mutant(
        "beam-candidates",
        "beam search expands beam_size candidates per beam instead of beam_size + 1",
        "whisper-tiny-en",
        "message-beam5-patience",
        patch=fault.one_candidate_short,
    ),
    Mutant(
        "segment-end",
        "every segment ends one timestamp step (20 ms) late",
        "whisper-tiny-en",
        "fox-beam5",
        patch=fault.segment_end_one_step_late,
    ),
    Mutant(
        "subtitle-width",
        "subtitle lines packed one character wider",
        "whisper-tiny-en",
        "fox-words",
        patch=fault.subtitle_line_one_wider,
    ),
    Mutant(
        "fast-logits",
        "the fast path's logits scaled by 1.01 (every argmax kept)",
        "whisper-tiny-en",
        "fox-fast",
        patch=fault.fast_logits_scaled,
    ),
    Mutant(
        "fast-attention-ulp",
        "the fast path's attention scales one float32 ULP high",
        "whisper-tiny-en",
        "fox-fast",
        patch=fault.fast_attention_scale_ulp,
    ),
    # Faults that float32 may round away (issue 18 part 5), each with its half-precision twins.
    Mutant(
        "final-norm-eps",
        "the final RMSNorm alone with eps ten times smaller (1e-5 -> 1e-6 on SmolLM2)",
        "smollm2-135m",
        "chat",
        hook=fault.final_norm_eps,
        on=LLM_CHAT_TWINS,
    ),
    Mutant(
        "imprecise-softmax",
        "the attention softmax without precise=True (Whisper's attention; the quantized-KV attention)",
        "whisper-large-v3-turbo-mini",
        "fox-detect-language",
        patch=fault.imprecise_softmax,
        on={"whisper-large-v3-turbo-fp16": "fox-english", "minicpm5-2b-mini": "kv4-from-prefill", **LLM_KV_TWINS},
    ),
    Mutant(
        "dequant-fused-sdpa",
        "quantized K/V dequantized and attended by the fused SDPA, not mlx-lm's quantized attention",
        "minicpm5-2b-mini",
        "kv4-from-prefill",
        patch=fault.dequantize_then_fused_sdpa,
        on=LLM_KV_TWINS,
    ),
    Mutant(
        "draft-rewind",
        "the draft cache rewound as if every draft were rejected after a partial acceptance",
        "minicpm5-2b-mini",
        "spec-requant-k3",
        patch=fault.draft_rewind_ignores_accepted,
        on={"smollm2-135m": "spec-requant-k2"},
    ),
    Mutant(
        "rotating-trim",
        "a multi-token write into a full rotating cache drops one old position too few",
        "minicpm5-2b-mini",
        "rotating-kv-chunked",
        patch=fault.rotating_trim_off_by_one,
    ),
    Mutant(
        "rotating-wrapped-order",
        "a wrapped rotating cache put back in the wrong temporal order before a multi-token write",
        "minicpm5-2b-mini",
        "rotating-kv-turns",
        patch=fault.rotating_wrapped_order,
    ),
    Mutant(
        "stream-at-finish",
        "the streaming transcriber decodes nothing while fed, every window at finish()",
        "whisper-tiny-en",
        "long-two-windows",
        patch=fault.stream_decodes_only_at_finish,
    ),
]
MUTANTS += TEXT_MUTANTS  # the detokenizer's flush and the response split (issue 31)
MUTANTS += WHISPER_MUTANTS  # word timing's pause rule and the writers' millisecond rounding (issue 31)
MUTANTS += STREAM_MUTANTS  # the SentencePiece and decode-based streams, on the llama-* twins (issue 31)
MUTANTS += ROPE_MUTANTS  # one slip per rope type, each on its rope twin (issue 53)
MUTANTS += TOKEN_MUTANTS  # the legacy special-token layout, on llama-legacy-tokens-mini (issue 53)
MUTANTS += L2_CACHE_MUTANTS  # the rotating quantized KV cache's chunked writes and growth (issue 53)
MUTANTS += COMPILED_MUTANTS  # the compiled loop's kept cache over turns, its blocks variant (issue 53)
