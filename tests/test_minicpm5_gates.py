"""MiniCPM5-2B (mini twin) gates fail on the faults a port would make.

Each test perturbs the in-tree side only (a copied artifact with one file edited, or one
generation option changed) and judges it against the real mlx-lm goldens of the mini twin.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import pytest

from harness.checks.registry import CHECKS
from harness.errors import NonDeterministicError
from harness.runners.llama import LlamaRunner
from harness.session import ParitySession

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("minicpm5-2b-mini")]

MODEL = "minicpm5-2b-mini"


@pytest.fixture(scope="module")
def session() -> ParitySession:
    return ParitySession()


def judge(session: ParitySession, scenario_id: str, check: str, runner: LlamaRunner | None = None, **spec_edits):
    profile = session.profile(MODEL)
    scenario = profile.scenario(scenario_id)
    golden = session.full_golden(profile, scenario)  # the check functions read full vectors
    mode, fn = CHECKS[check].run, CHECKS[check].compare
    runner = runner or session.runner(profile)
    spec = profile.scenario_spec(scenario) | spec_edits
    record = runner.run(spec, forced=golden if mode == "teacher_forced" else None)
    return fn(golden, record)


def edited_artifact(session: ParitySession, tmp_path: Path, name: str, edit) -> LlamaRunner:
    source = session.artifact(session.profile(MODEL)).model_dir
    copy = tmp_path / "artifact"
    shutil.copytree(source, copy)
    path = copy / name
    path.write_text(edit(path.read_text()))
    return LlamaRunner(copy)


def test_unperturbed_gates_pass(session: ParitySession) -> None:
    assert judge(session, "eos-im-end", "eos_stop").passed
    assert judge(session, "kv8-converts-mid-decode", "decode_logits").passed


def test_dropping_one_eos_id_is_caught(session: ParitySession, tmp_path: Path) -> None:
    def drop_im_end(text: str) -> str:
        config = json.loads(text)
        config["eos_token_id"] = [1]
        return json.dumps(config)

    runner = edited_artifact(session, tmp_path, "generation_config.json", drop_im_end)
    result = judge(session, "eos-im-end", "eos_stop", runner)
    assert not result.passed and "EOS id sets differ" in result.summary, result.summary


def test_chat_template_whitespace_is_caught(session: ParitySession, tmp_path: Path) -> None:
    header = "'<|im_start|>assistant\\n'"  # as the template writes it: a Jinja string with \n

    def add_space(template: str) -> str:
        assert header in template
        return template.replace(header, header.replace("assistant", "assistant "))

    runner = edited_artifact(session, tmp_path, "chat_template.jinja", add_space)
    result = judge(session, "think-off", "prompt_identity", runner)
    assert not result.passed and "rendered prompts differ" in result.summary, result.summary


@pytest.mark.parametrize(
    ("scenario_id", "edit"),
    [
        ("kv8-converts-mid-decode", {"kv_group_size": 32}),
        ("kv8-converts-mid-decode", {"quantized_kv_start": 41}),
        ("kv4-from-prefill", {"kv_bits": 8}),
        ("rotating-kv", {"max_kv_size": 25}),
        # L2 compositions (judged against mlx-optiq): one layer's kv bits, the conversion start,
        # the window of the rotating quantized cache.
        (
            "l2-mixed-kv",
            {
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
        (
            "l2-streaming-kv-delayed",
            {"composition": {"kind": "streaming_kv", "kv_bits": 8, "kv_group_size": 64, "quantized_kv_start": 31}},
        ),
        (
            "l2-rotating-quantized-kv",
            {
                "composition": {
                    "kind": "rotating_quantized_kv",
                    "max_kv_size": 25,
                    "keep": 4,
                    "kv_bits": 4,
                    "kv_group_size": 64,
                }
            },
        ),
    ],
)
def test_kv_cache_option_changes_are_caught(session: ParitySession, scenario_id: str, edit: dict) -> None:
    result = judge(session, scenario_id, "teacher_forced_logits", **edit)
    assert not result.passed and result.first_bad_step is not None, result.summary


def test_a_non_deterministic_implementation_fails_before_any_comparison() -> None:
    """A model whose output drifts between calls is refused with its own message."""

    def hook(model) -> None:
        cls = type(model)
        calls = [0]

        def drifting_call(self, inputs, cache=None):
            calls[0] += 1
            logits = cls.__call__(self, inputs, cache)
            return logits + mx.zeros(logits.shape[-1]).at[7].add(calls[0] * 1e-3)

        model.__class__ = type("Drifting", (cls,), {"__call__": drifting_call})

    session = ParitySession(model_hook=hook)
    profile = session.profile(MODEL)
    with pytest.raises(NonDeterministicError, match=r"not deterministic on minicpm5-2b-mini/think-on.*step 0"):
        session.run_check(profile, profile.scenario("think-on"), "prompt_identity")


def test_a_cache_not_kept_across_turns_is_caught(session: ParitySession, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prompt-cache reuse: decoding turn 2 on a fresh cache (the conversation forgotten) fails
    from turn 2's first step, and the failure names the turn."""
    import models.universal as universal

    def fresh_cache_each_turn(model, turn_prompts, n_tokens, *, forced_tokens=None, **options):
        return [
            list(universal.greedy_steps(model, ids, n_tokens, forced_tokens=forced, **options))
            for ids, forced in zip(turn_prompts, forced_tokens or [None] * len(turn_prompts), strict=True)
        ]

    monkeypatch.setattr(universal, "chat_turn_steps", fresh_cache_each_turn)
    profile = session.profile(MODEL)
    n = profile.steps(profile.scenario("cache-reuse")) + 1
    runner = LlamaRunner(session.artifact(profile).model_dir)
    result = judge(session, "cache-reuse", "teacher_forced_logits", runner)
    assert not result.passed and result.first_bad_step == n, result.summary
    assert "(turn 1 step 0)" in result.summary, result.summary


def test_batch_rows_without_the_padding_mask_are_caught(
    session: ParitySession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batched decoding: attending to the left padding changes the shorter (padded) row only."""
    from models.universal import cache as cache_module

    original = cache_module.create_batch_causal_mask
    monkeypatch.setattr(
        cache_module, "create_batch_causal_mask", lambda n, offset, left_padding: original(n, offset, left_padding * 0)
    )
    runner = LlamaRunner(session.artifact(session.profile(MODEL)).model_dir)
    result = judge(session, "batch-two-rows", "teacher_forced_logits", runner)
    assert not result.passed and "(batch row 0 step 0)" in result.summary, result.summary


def test_a_changed_drafting_window_is_caught(session: ParitySession) -> None:
    """n-gram drafting (L2): drafting 4 tokens instead of 8 changes the drafted/accepted counts."""
    composition = {"kind": "ngram_draft", "num_draft_tokens": 4, "ngram_min": 3, "ngram_max": 3}
    result = judge(session, "l2-ngram-draft", "draft_stats", composition=composition)
    assert not result.passed and "drafted/accepted counts differs" in result.summary, result.summary


def test_a_changed_fused_sdpa_tile_size_is_caught() -> None:
    """Fused quantized SDPA (L2, bf16 mini twin): 16-position tiles instead of 8 change the
    online softmax's rounding, and the gate sees it."""
    session = ParitySession()
    profile = session.profile("minicpm5-2b-mini-bf16")
    scenario = profile.scenario("l2-fused-sdpa")
    golden = session.full_golden(profile, scenario)
    composition = dict(scenario.composition or {}) | {"n_chunk": 16}
    spec = profile.scenario_spec(scenario) | {"composition": composition}
    record = session.runner(profile).run(spec, forced=golden)
    result = CHECKS["teacher_forced_logits"].compare(golden, record)
    assert not result.passed, result.summary
