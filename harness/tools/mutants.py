"""Mutation testing of the gates: known faults injected into the in-tree implementations, each
of which the gates must catch (`make mutants`).

Every mutant is one plausible bug (a config slip, one ULP in one weight, a dropped decoding
rule, a forgotten cache, a changed KV option...). It is applied in process (a model hook, a
monkeypatch, or an edited scenario spec), judged by the real gates against the committed
goldens, and counts as *killed* when at least one of its checks fails. The mutation score is
killed / scored; anything below 100 % exits 1 and names the survivors. A mutant whose output
is bit-identical to the unmutated implementation's is *equivalent* (no gate can see a fault
that changes nothing): it is reported as such and not scored.

    .venv/bin/python -m harness.tools.mutants [--only NAME ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np


def _one_ulp_up(array: mx.array) -> mx.array:
    values = np.array(array)
    values.flat[0] = np.nextafter(values.flat[0], np.float32(np.inf))
    return mx.array(values)


@dataclass
class Mutant:
    name: str
    fault: str  # what the bug is, in words
    model: str
    scenario: str
    hook: Callable[[Any], None] | None = None  # applied to the loaded in-tree model
    patch: Callable[[], contextlib.AbstractContextManager[None]] | None = None  # code-level fault
    spec_edits: dict[str, Any] = field(default_factory=dict)  # scenario-level fault (options)


@contextlib.contextmanager
def _setattr(target: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, old)


def _all_norm_eps(model: Any) -> None:
    for layer in model.model.layers:
        layer.input_layernorm.eps = layer.post_attention_layernorm.eps = 1e-6
    model.model.norm.eps = 1e-6


def _rope_base(model: Any) -> None:
    import mlx.nn as nn

    for layer in model.model.layers:
        rope = layer.self_attn.rope
        layer.self_attn.rope = nn.RoPE(
            rope.dims, traditional=rope.traditional, base=rope.base * 1.0001, scale=rope.scale
        )


def _attention_scale(model: Any) -> None:
    for layer in model.model.layers:
        layer.self_attn.scale = np.float32(layer.self_attn.scale) * np.float32(1.0001)


def _swap_gate_up(model: Any) -> None:
    mlp = model.model.layers[3].mlp
    mlp.gate_proj, mlp.up_proj = mlp.up_proj, mlp.gate_proj


def _skip_final_norm(model: Any) -> None:
    model.model.norm.weight = model.model.norm.weight * 0 + 1  # a norm without its learned scale


def _ulp_layer_norm(model: Any) -> None:
    norm = model.model.layers[17].post_attention_layernorm
    norm.weight = _one_ulp_up(norm.weight)


def _drop_eos(runner_cls: Any) -> contextlib.AbstractContextManager[None]:
    from models.universal.tokenizer import ChatTokenizer

    original = ChatTokenizer.eos_token_ids

    def fewer(self: Any) -> frozenset[int]:
        return frozenset(sorted(original.fget(self))[:-1])

    return _setattr(ChatTokenizer, "eos_token_ids", property(fewer))


def _template_space() -> contextlib.AbstractContextManager[None]:
    from models.universal.tokenizer import ChatTokenizer

    original = ChatTokenizer.render_chat_like_mlx_lm

    def render(self: Any, *args: Any, **kwargs: Any) -> str:
        return original(self, *args, **kwargs).replace("assistant\n", "assistant \n")

    return _setattr(ChatTokenizer, "render_chat_like_mlx_lm", render)


def _fresh_cache_each_turn() -> contextlib.AbstractContextManager[None]:
    import models.universal as universal

    def turns(model: Any, turn_prompts: list[list[int]], n_tokens: int, *, forced_tokens=None, **options: Any):
        forced = forced_tokens or [None] * len(turn_prompts)
        return [
            list(universal.greedy_steps(model, ids, n_tokens, forced_tokens=f, **options))
            for ids, f in zip(turn_prompts, forced, strict=True)
        ]

    return _setattr(universal, "chat_turn_steps", turns)


def _mel_nudge() -> contextlib.AbstractContextManager[None]:
    import models.whisper.transcribe as transcribe

    original = transcribe.log_mel_spectrogram

    def nudged(*args: Any, **kwargs: Any) -> mx.array:
        mel = original(*args, **kwargs)
        return mel + mx.zeros(mel.shape).at[5, 3].add(1e-3)

    return _setattr(transcribe, "log_mel_spectrogram", nudged)


def _no_timestamp_rules() -> contextlib.AbstractContextManager[None]:
    import models.whisper.decoding as decoding

    return _setattr(decoding.ApplyTimestampRules, "apply", lambda self, logits, tokens: logits)


def _whisper_encoder_ulp(model: Any) -> None:
    model.encoder.ln_post.weight = _one_ulp_up(model.encoder.ln_post.weight)


def _whisper_decoder_ulp(model: Any) -> None:
    model.decoder.ln.weight = _one_ulp_up(model.decoder.ln.weight)


def _compiled_rope_offset() -> contextlib.AbstractContextManager[None]:
    """A fault in the compiled decode trace only: RoPE one position ahead (the eager loop is right)."""
    import models.universal.compiled as compiled

    rope = compiled.apply_rope
    stack = contextlib.ExitStack()
    stack.enter_context(_setattr(compiled, "_decoders", {}))  # traced afresh, dropped afterwards
    stack.enter_context(_setattr(compiled, "apply_rope", lambda layer, q, k, offset: rope(layer, q, k, offset + 1)))
    return stack


def _no_logprob_fallback() -> contextlib.AbstractContextManager[None]:
    import models.whisper.transcribe as transcribe

    original = transcribe.needs_fallback
    return _setattr(
        transcribe, "needs_fallback", lambda result, ratio, logprob, no_speech: original(result, ratio, None, no_speech)
    )


def _ranker_without_length_norm() -> contextlib.AbstractContextManager[None]:
    import models.whisper.decoding as decoding

    def rank(self: Any, tokens: list, sum_logprobs: list) -> list[int]:
        return [int(np.argmax(group)) for group in sum_logprobs]

    return _setattr(decoding.MaximumLikelihoodRanker, "rank", rank)


def _patience_ignored() -> contextlib.AbstractContextManager[None]:
    import models.whisper.decoding as decoding

    original = decoding.BeamSearchDecoder.__init__

    def init(self: Any, beam_size: int, eot: int, inference: Any, patience: float | None = None) -> None:
        original(self, beam_size, eot, inference, patience)
        self.max_candidates = beam_size  # as if patience were 1

    return _setattr(decoding.BeamSearchDecoder, "__init__", init)


def _one_candidate_short() -> contextlib.AbstractContextManager[None]:
    import models.whisper.decoding as decoding

    original = decoding.BeamSearchDecoder.top_candidates

    def top(self: Any, logits: mx.array, sum_logprobs: mx.array) -> tuple[list, list]:
        ids, scores = original(self, logits, sum_logprobs)
        return [row[:-1] for row in ids], [row[:-1] for row in scores]  # beam_size, not beam_size + 1

    return _setattr(decoding.BeamSearchDecoder, "top_candidates", top)


def _segment_end_one_step_late() -> contextlib.AbstractContextManager[None]:
    import models.whisper.transcribe as transcribe

    original = transcribe.split_segments

    def split(*args: Any, **kwargs: Any) -> Any:
        window = original(*args, **kwargs)
        for segment in window.segments:
            segment["end"] = round(segment["end"] + 0.02, 2)  # one timestamp step
        return window

    return _setattr(transcribe, "split_segments", split)


def _subtitle_line_one_wider() -> contextlib.AbstractContextManager[None]:
    import models.whisper.writers as writers

    original = writers._pack_subtitles

    def one_wider(segments: Any, *, max_line_width: int, **kwargs: Any) -> Any:
        return original(segments, max_line_width=max_line_width + 1, **kwargs)

    return _setattr(writers, "_pack_subtitles", one_wider)


def _fast_logits_scaled() -> contextlib.AbstractContextManager[None]:
    from models.whisper.fast import FastWhisper

    original = FastWhisper._logits
    return _setattr(FastWhisper, "_logits", lambda self, x: original(self, x) * 1.01)


def _fast_attention_scale_ulp() -> contextlib.AbstractContextManager[None]:
    from models.whisper.fast import FastWhisper

    original = FastWhisper.__init__

    def init(self: Any, model: Any) -> None:
        original(self, model)
        for name in ("audio_attention_scale", "text_attention_scale"):
            setattr(self, name, float(np.nextafter(np.float32(getattr(self, name)), np.float32(np.inf))))

    return _setattr(FastWhisper, "__init__", init)


MUTANTS = [
    Mutant("norm-eps", "every RMSNorm eps 1e-6 instead of 1e-5", "smollm2-135m", "chat", hook=_all_norm_eps),
    Mutant("rope-base", "rope base off by 1e-4 relative", "smollm2-135m", "chat", hook=_rope_base),
    Mutant(
        "attention-scale",
        "attention scale off by 1e-4 relative",
        "smollm2-135m",
        "chat",
        hook=_attention_scale,
    ),
    Mutant(
        "gate-up-swap",
        "MLP gate and up projections swapped in one layer",
        "smollm2-135m",
        "chat",
        hook=_swap_gate_up,
    ),
    Mutant(
        "final-norm-scale",
        "final norm without its learned scale",
        "smollm2-135m",
        "chat",
        hook=_skip_final_norm,
    ),
    Mutant("one-ulp", "one ULP in one norm weight of layer 17", "smollm2-135m", "chat", hook=_ulp_layer_norm),
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
        patch=lambda: _drop_eos(None),
    ),
    Mutant(
        "template-space",
        "a space after the assistant header",
        "minicpm5-2b-mini",
        "think-off",
        patch=_template_space,
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
        patch=_fresh_cache_each_turn,
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
        patch=_mel_nudge,
    ),
    Mutant(
        "encoder-ulp",
        "one ULP in the encoder's final norm",
        "whisper-large-v3-turbo-mini",
        "fox-detect-language",
        hook=_whisper_encoder_ulp,
    ),
    Mutant(
        "decoder-ulp",
        "one ULP in the decoder's final norm",
        "whisper-large-v3-turbo-mini",
        "fox-detect-language",
        hook=_whisper_decoder_ulp,
    ),
    Mutant(
        "timestamp-rules",
        "the timestamp grammar filter dropped",
        "whisper-large-v3-turbo-mini",
        "fox-detect-language",
        patch=_no_timestamp_rules,
    ),
    Mutant(
        "compiled-rope",
        "RoPE one position ahead in the compiled decode trace only",
        "minicpm5-2b-mini",
        "think-default",
        patch=_compiled_rope_offset,
    ),
    Mutant(
        "fallback-logprob",
        "the log-probability fallback rule dropped",
        "whisper-large-v3-turbo-mini",
        "fox-english-ladder",
        patch=_no_logprob_fallback,
    ),
    Mutant(
        "beam-ranker",
        "beam candidates ranked without length normalization",
        "whisper-tiny-en",
        "message-beam5-patience",
        patch=_ranker_without_length_norm,
    ),
    Mutant(
        "beam-patience",
        "beam search waits for beam_size finished sequences, not beam_size x patience",
        "whisper-tiny-en",
        "message-beam5-patience",
        patch=_patience_ignored,
    ),
    Mutant(
        "beam-candidates",
        "beam search expands beam_size candidates per beam instead of beam_size + 1",
        "whisper-tiny-en",
        "message-beam5-patience",
        patch=_one_candidate_short,
    ),
    Mutant(
        "segment-end",
        "every segment ends one timestamp step (20 ms) late",
        "whisper-tiny-en",
        "fox-beam5",
        patch=_segment_end_one_step_late,
    ),
    Mutant(
        "subtitle-width",
        "subtitle lines packed one character wider",
        "whisper-tiny-en",
        "fox-words",
        patch=_subtitle_line_one_wider,
    ),
    Mutant(
        "fast-logits",
        "the fast path's logits scaled by 1.01 (every argmax kept)",
        "whisper-tiny-en",
        "fox-fast",
        patch=_fast_logits_scaled,
    ),
    Mutant(
        "fast-attention-ulp",
        "the fast path's attention scales one float32 ULP high",
        "whisper-tiny-en",
        "fox-fast",
        patch=_fast_attention_scale_ulp,
    ),
]

# Checks shown failing by a test of the gate (`make test`) as well as, or instead of, a mutant:
# test ids, each a test that makes the check fail on a perturbed implementation or record.
GATE_TESTS: dict[str, tuple[str, ...]] = {
    "compiled_decode": (
        "tests/test_compiled_decode.py::test_compiled_decode_check_fails_through_the_session_on_a_perturbed_trace",
    ),
    "writers": ("tests/test_whisper_writers.py::test_a_line_width_off_by_one_fails_naming_a_subtitle_format",),
    "token_budget": (
        "tests/test_whisper_fast.py::test_the_gate_fails_a_fast_path_whose_logits_are_scaled_by_1_01",
        "tests/test_whisper_fast.py::test_the_gate_fails_an_attention_scale_one_ulp_off",
        "tests/test_whisper_fast.py::test_the_gate_fails_a_budget_edited_away_from_its_record",
    ),
    "eos_stop": ("tests/test_gate_fails.py::test_a_run_that_does_not_stop_at_eos_fails_eos_stop",),
    "decode_tokens": (
        "tests/test_token_level_checks.py::test_token_level_checks_ignore_foreign_floats_and_catch_token_and_text_changes",
    ),
    "transcript_text": (
        "tests/test_token_level_checks.py::test_token_level_checks_ignore_foreign_floats_and_catch_token_and_text_changes",
    ),
}


def registry() -> list[str]:
    """Every check a profile can name, in the session's registry order."""
    from harness.session import CHECKS, SESSION_CHECKS

    return [*CHECKS, *SESSION_CHECKS]


def judge(mutant: Mutant) -> dict[str, Any]:
    """The mutant through `ParitySession.run_check`, the path `make parity` takes (compact
    goldens decided by their digests, full vectors fetched only to explain a difference), on
    every check the scenario declares: per check "passed", "failed" or "error"."""
    from harness.errors import HarnessError
    from harness.session import ParitySession, runnable_spec

    session = ParitySession(model_hook=mutant.hook)
    profile = session.profile(mutant.model)
    scenario = profile.scenario(mutant.scenario)
    if mutant.spec_edits:
        session.intree_spec_edits[(profile.name, scenario.id)] = mutant.spec_edits
    started = time.perf_counter()
    outcomes: dict[str, str] = {}
    summaries: dict[str, str] = {}
    with mutant.patch() if mutant.patch else contextlib.nullcontext():
        for check in profile.checks(scenario):
            try:
                result = session.run_check(profile, scenario, check)
            except HarnessError as e:  # as make parity: an ERROR row, never a pass
                outcomes[check], summaries[check] = "error", f"{type(e).__name__}: {e}"
                continue
            outcomes[check] = "passed" if result.passed else "failed"
            summaries[check] = result.summary
    killed = any(o != "passed" for o in outcomes.values())
    equivalent = False
    if not killed:
        # A survivor is only a gate weakness if the fault changes what the implementation computes:
        # compare with the unmutated implementation on the unedited scenario, bit for bit.
        mutated = session.intree(profile, scenario, "free")
        clean = ParitySession().runner(profile).run(runnable_spec(profile.scenario_spec(scenario)))
        equivalent = (
            clean.tokens == mutated.tokens
            and clean.logits.tobytes() == mutated.logits.tobytes()
            and all(clean.arrays[k].tobytes() == mutated.arrays[k].tobytes() for k in clean.arrays)
            and clean.extra == mutated.extra
        )
    return {
        "killed": killed,
        "equivalent": equivalent,
        "outcomes": outcomes,
        "summaries": summaries,
        "seconds": time.perf_counter() - started,
    }


def matrix(judged: dict[str, dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(markdown lines of the check x mutant matrix, the registry checks with no kill).

    A cell: K the check failed on that mutant, E it errored, . it passed, blank not declared by
    the mutant's scenario. A check is killed by a mutant whose run it failed, or by a gate test
    (GATE_TESTS) that shows it failing."""
    names = list(judged)
    lines = [
        "| check | " + " | ".join(names) + " | gate tests |",
        "|---|" + "---|" * len(names) + "---|",
    ]
    symbol = {"failed": "K", "error": "E", "passed": "."}
    lacking = []
    for check in registry():
        cells = [symbol.get(judged[n]["outcomes"].get(check, ""), "") for n in names]
        tests = GATE_TESTS.get(check, ())
        if "K" not in cells and not tests:
            lacking.append(check)
        shown = ", ".join(t.rsplit("::", 1)[-1] for t in tests) or "-"
        lines.append(f"| {check} | " + " | ".join(cells) + f" | {shown} |")
    return lines, lacking


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.tools.mutants", description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="mutant names (the matrix then covers only them)")
    args = parser.parse_args(argv)
    os.environ.setdefault("MLX_PARITY_LOCALIZE", "0")
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    unknown = sorted(set(args.only or ()) - {m.name for m in MUTANTS})
    if unknown:
        print(f"error: unknown mutants {unknown}; known: {[m.name for m in MUTANTS]}")
        return 2
    rows, survivors, equivalents, judged = [], [], [], {}
    for mutant in chosen:
        outcome = judged[mutant.name] = judge(mutant)
        if outcome["equivalent"]:
            equivalents.append(mutant.name)
        elif not outcome["killed"]:
            survivors.append(mutant.name)
        caught = ", ".join(
            c + (" (error)" if o == "error" else "") for c, o in outcome["outcomes"].items() if o != "passed"
        )
        verdict = "KILLED" if outcome["killed"] else "EQUIVALENT" if outcome["equivalent"] else "SURVIVED"
        where = f"{mutant.model}/{mutant.scenario}"
        rows.append(
            f"| {mutant.name} | {mutant.fault} | {where} | {verdict} | {caught or '-'} | {outcome['seconds']:.0f} |"
        )
        print(rows[-1], flush=True)
        for check, o in outcome["outcomes"].items():
            if o == "error":
                print(f"    {check}: {outcome['summaries'][check][:300]}", flush=True)
    scored = len(chosen) - len(equivalents)
    killed = scored - len(survivors)
    print("\n| mutant | fault | judged on | verdict | failing checks | s |\n|---|---|---|---|---|---:|")
    print("\n".join(rows))
    lines, lacking = matrix(judged)
    print("\ncheck x mutant (K failed, E error, . passed, blank: not a check of that scenario):\n")
    print("\n".join(lines))
    not_scored = f"; equivalent (output bit-identical to the unmutated one, not scored): {', '.join(equivalents)}"
    print(
        f"\nmutation score: {killed}/{scored} killed"
        + (f"; SURVIVED: {', '.join(survivors)}" if survivors else "")
        + (not_scored if equivalents else "")
    )
    if lacking:
        print(f"checks with no kill (no mutant failed them, no gate test): {', '.join(lacking)}")
    return 1 if survivors or lacking else 0


if __name__ == "__main__":
    raise SystemExit(main())
