"""Mutation testing of the gates: known faults injected into the in-tree implementations, each
of which the gates must catch (`make mutants`).

Every mutant is one plausible bug (a config slip, one ULP in one weight, a dropped decoding
rule, a forgotten cache, a changed KV option...). It is applied in process (a model hook, a
monkeypatch, or an edited scenario spec), judged by the real gates against the committed
goldens, and counts as *killed* when at least one of its checks fails. The mutation score is
killed / scored; anything below 100 % exits 1 and names the survivors. A mutant whose output
is bit-identical to the unmutated implementation's is *equivalent* (no gate can see a fault
that changes nothing): it is reported as such and not scored.

    .venv/bin/python -m harness mutants [--only NAME ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from typing import Any

from harness.checks.registry import get as registry_check
from harness.tools import mutant_faults as fault
from harness.tools.mutant_faults import Mutant

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
    Mutant("one-ulp", "one ULP in one norm weight of layer 17", "smollm2-135m", "chat", hook=fault.ulp_layer_norm),
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
]


def registry() -> list[str]:
    """Every check a profile can name, in the session's registry order."""
    from harness.checks.registry import CHECKS

    return list(CHECKS)


def judge(mutant: Mutant) -> dict[str, Any]:
    """The mutant through `ParitySession.run_check`, the path `make parity` takes (compact
    goldens decided by their digests, full vectors fetched only to explain a difference), on
    every check the scenario declares: per check "passed", "failed" or "error"."""
    from harness.errors import HarnessError
    from harness.goldens.lifecycle import runnable_spec
    from harness.session import ParitySession

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
    (the registry's failing_tests) that shows it failing."""
    names = list(judged)
    lines = [
        "| check | " + " | ".join(names) + " | gate tests |",
        "|---|" + "---|" * len(names) + "---|",
    ]
    symbol = {"failed": "K", "error": "E", "passed": "."}
    lacking = []
    for check in registry():
        cells = [symbol.get(judged[n]["outcomes"].get(check, ""), "") for n in names]
        tests = registry_check(check).failing_tests
        if "K" not in cells and not tests:
            lacking.append(check)
        shown = ", ".join(t.rsplit("::", 1)[-1] for t in tests) or "-"
        lines.append(f"| {check} | " + " | ".join(cells) + f" | {shown} |")
    return lines, lacking


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness mutants", description=__doc__.splitlines()[0])
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
