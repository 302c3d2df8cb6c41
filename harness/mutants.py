"""Mutation testing of the gates: known faults injected into the in-tree implementations, each
of which the gates must catch (`make mutants`).

Every mutant is one plausible bug (a config slip, one ULP in one weight, a dropped decoding
rule, a forgotten cache, a changed KV option...). It is applied in process (a model hook, a
monkeypatch, or an edited scenario spec), judged by the real gates against the committed
goldens, and counts as *killed* when at least one of its checks fails. The mutation score is
killed / scored; anything below 100 % exits 1 and names the survivors. A mutant whose output
is bit-identical to the unmutated implementation's is *equivalent* (no gate can see a fault
that changes nothing): it is reported as such and not scored.

    .venv/bin/python -m harness.mutants [--only NAME ...]
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
    checks: tuple[str, ...]
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


LLM_CHECKS = (
    "prompt_identity",
    "prefill_logits",
    "decode_logits",
    "teacher_forced_logits",
    "greedy_tokens",
    "eos_stop",
)
SPEECH = ("mel", "encoder_output", "prefill_logits", "teacher_forced_logits", "greedy_tokens", "transcript")

MUTANTS = [
    Mutant(
        "norm-eps", "every RMSNorm eps 1e-6 instead of 1e-5", "smollm2-135m", "chat", LLM_CHECKS, hook=_all_norm_eps
    ),
    Mutant("rope-base", "rope base off by 1e-4 relative", "smollm2-135m", "chat", LLM_CHECKS, hook=_rope_base),
    Mutant(
        "attention-scale",
        "attention scale off by 1e-4 relative",
        "smollm2-135m",
        "chat",
        LLM_CHECKS,
        hook=_attention_scale,
    ),
    Mutant(
        "gate-up-swap",
        "MLP gate and up projections swapped in one layer",
        "smollm2-135m",
        "chat",
        LLM_CHECKS,
        hook=_swap_gate_up,
    ),
    Mutant(
        "final-norm-scale",
        "final norm without its learned scale",
        "smollm2-135m",
        "chat",
        LLM_CHECKS,
        hook=_skip_final_norm,
    ),
    Mutant(
        "one-ulp", "one ULP in one norm weight of layer 17", "smollm2-135m", "chat", LLM_CHECKS, hook=_ulp_layer_norm
    ),
    Mutant(
        "prefill-chunks",
        "prompt prefilled in one chunk where the profile says 16",
        "smollm2-135m",
        "chunked-prefill",
        LLM_CHECKS,
        spec_edits={"prefill_step_size": 2048},
    ),
    Mutant(
        "eos-dropped",
        "one of MiniCPM5's two EOS ids forgotten",
        "minicpm5-2b-mini",
        "eos-im-end",
        LLM_CHECKS,
        patch=lambda: _drop_eos(None),
    ),
    Mutant(
        "template-space",
        "a space after the assistant header",
        "minicpm5-2b-mini",
        "think-off",
        LLM_CHECKS,
        patch=_template_space,
    ),
    Mutant(
        "kv-group-size",
        "quantized KV group size 32 instead of 64",
        "minicpm5-2b-mini",
        "kv8-converts-mid-decode",
        LLM_CHECKS,
        spec_edits={"kv_group_size": 32},
    ),
    Mutant(
        "kv-start",
        "KV conversion one position late",
        "minicpm5-2b-mini",
        "kv8-converts-mid-decode",
        LLM_CHECKS,
        spec_edits={"quantized_kv_start": 41},
    ),
    Mutant(
        "rotating-window",
        "rotating window one larger",
        "minicpm5-2b-mini",
        "rotating-kv",
        LLM_CHECKS,
        spec_edits={"max_kv_size": 25},
    ),
    Mutant(
        "cache-forgotten",
        "a fresh cache for every chat turn",
        "minicpm5-2b-mini",
        "cache-reuse",
        LLM_CHECKS,
        patch=_fresh_cache_each_turn,
    ),
    Mutant(
        "l2-layer-bits",
        "one layer's KV bits 8 instead of 4 (mixed precision)",
        "minicpm5-2b-mini",
        "l2-mixed-kv",
        ("prefill_logits", "decode_logits", "teacher_forced_logits", "greedy_tokens"),
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
        ("draft_stats", "decode_logits"),
        spec_edits={"composition": {"kind": "ngram_draft", "num_draft_tokens": 4, "ngram_min": 3, "ngram_max": 3}},
    ),
    Mutant(
        "mel",
        "one log-mel value nudged by 1e-3",
        "whisper-large-v3-turbo-mini",
        "fox-detect-language",
        SPEECH,
        patch=_mel_nudge,
    ),
    Mutant(
        "encoder-ulp",
        "one ULP in the encoder's final norm",
        "whisper-large-v3-turbo-mini",
        "fox-detect-language",
        SPEECH,
        hook=_whisper_encoder_ulp,
    ),
    Mutant(
        "decoder-ulp",
        "one ULP in the decoder's final norm",
        "whisper-large-v3-turbo-mini",
        "fox-detect-language",
        SPEECH,
        hook=_whisper_decoder_ulp,
    ),
    Mutant(
        "timestamp-rules",
        "the timestamp grammar filter dropped",
        "whisper-large-v3-turbo-mini",
        "fox-detect-language",
        SPEECH,
        patch=_no_timestamp_rules,
    ),
]


def judge(mutant: Mutant) -> dict[str, Any]:
    from harness.session import CHECKS, ParitySession, runnable_spec

    session = ParitySession(model_hook=mutant.hook)
    profile = session.profile(mutant.model)
    scenario = profile.scenario(mutant.scenario)
    started = time.perf_counter()
    failed: dict[str, str] = {}
    with mutant.patch() if mutant.patch else contextlib.nullcontext():
        golden = session.full_golden(profile, scenario)  # the check functions read full vectors
        spec = runnable_spec(profile.scenario_spec(scenario) | mutant.spec_edits)
        runner = session.runner(profile)
        records = {
            "free": runner.run(spec),
            "teacher_forced": runner.run(spec, forced=golden),
        }
        for check in mutant.checks:
            mode, fn = CHECKS[check]
            result = fn(golden, records[mode])
            if not result.passed:
                failed[check] = result.summary
    equivalent = False
    if not failed:
        # A survivor is only a gate weakness if the fault changes what the implementation computes:
        # compare with the unmutated implementation on the unedited scenario, bit for bit.
        clean = ParitySession().runner(profile).run(runnable_spec(profile.scenario_spec(scenario)))
        mutated = records["free"]
        equivalent = (
            clean.tokens == mutated.tokens
            and clean.logits.tobytes() == mutated.logits.tobytes()
            and all(clean.arrays[k].tobytes() == mutated.arrays[k].tobytes() for k in clean.arrays)
            and clean.extra == mutated.extra
        )
    return {
        "killed": bool(failed),
        "equivalent": equivalent,
        "failed_checks": failed,
        "seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.mutants", description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="mutant names")
    args = parser.parse_args(argv)
    os.environ.setdefault("MLX_PARITY_LOCALIZE", "0")
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    rows, survivors, equivalents = [], [], []
    for mutant in chosen:
        outcome = judge(mutant)
        if outcome["equivalent"]:
            equivalents.append(mutant.name)
        elif not outcome["killed"]:
            survivors.append(mutant.name)
        caught = ", ".join(outcome["failed_checks"]) or "-"
        verdict = "KILLED" if outcome["killed"] else "EQUIVALENT" if outcome["equivalent"] else "SURVIVED"
        where = f"{mutant.model}/{mutant.scenario}"
        rows.append(f"| {mutant.name} | {mutant.fault} | {where} | {verdict} | {caught} | {outcome['seconds']:.0f} |")
        print(rows[-1], flush=True)
    scored = len(chosen) - len(equivalents)
    killed = scored - len(survivors)
    print("\n| mutant | fault | judged on | verdict | failing checks | s |\n|---|---|---|---|---|---:|")
    print("\n".join(rows))
    not_scored = f"; equivalent (output bit-identical to the unmutated one, not scored): {', '.join(equivalents)}"
    print(
        f"\nmutation score: {killed}/{scored} killed"
        + (f"; SURVIVED: {', '.join(survivors)}" if survivors else "")
        + (not_scored if equivalents else "")
    )
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main())
