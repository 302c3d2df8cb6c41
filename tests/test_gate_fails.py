"""Every gate fails on a perturbed implementation, and names the first bad step.

The in-tree model is perturbed in process (through the runner's model hook) and judged
against the real smollm2-135m goldens.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from harness.checks.localize import _SERVERS, close_servers
from harness.session import ParitySession

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("smollm2-135m")]

MODEL = "smollm2-135m"


def judge(hook, scenario: str, *checks: str) -> dict:
    session = ParitySession(model_hook=hook)
    profile = session.profile(MODEL)
    return {c: session.run_check(profile, profile.scenario(scenario), c) for c in checks}


def test_rmsnorm_eps_perturbation_fails_from_the_prefill() -> None:
    def hook(model) -> None:
        # A config slip: every RMSNorm gets eps 1e-6 where the artifact says 1e-5. (The final
        # norm alone is not enough: its inputs are large, so eps vanishes in float32 there.)
        for layer in model.model.layers:
            layer.input_layernorm.eps = layer.post_attention_layernorm.eps = 1e-6
        model.model.norm.eps = 1e-6

    close_servers()
    results = judge(hook, "plain", "prefill_logits", "decode_logits", "teacher_forced_logits", "prompt_identity")
    assert results["prompt_identity"].passed  # the tokenizer was not touched: no false alarm
    # Localized once for the scenario: decode_logits (first bad step 1) is explained by step 0,
    # by the one diagnose server the oracle started for the model.
    decode = results["decode_logits"].details["localization"]
    assert decode["row"] == 0 and "localized at step 0" in results["decode_logits"].summary
    assert [server.requests for server in _SERVERS.values()] == [1]
    close_servers()
    for check in ("prefill_logits", "teacher_forced_logits"):
        assert not results[check].passed and results[check].first_bad_step == 0, results[check].summary
        assert "first differing step 0" in results[check].summary and "max ULP" in results[check].summary
    assert not results["decode_logits"].passed and results["decode_logits"].first_bad_step == 1
    # Localized: the first module whose output differs is layer 0's input norm (eps changed there first).
    where = results["prefill_logits"].details["localization"]
    assert where["module"] == "model.layers.0.input_layernorm", where


def test_one_ulp_in_one_weight_is_caught() -> None:
    def hook(model) -> None:
        norm = model.model.layers[29].post_attention_layernorm
        weight = np.array(norm.weight)
        weight[0] = np.nextafter(weight[0], np.float32(np.inf))
        norm.weight = mx.array(weight)

    results = judge(hook, "chat", "prefill_logits", "teacher_forced_logits")
    for result in results.values():
        assert not result.passed and result.first_bad_step == 0, result.summary
        # Every module before it agrees bit for bit; the perturbed norm is named.
        assert "first diverging module: model.layers.29.post_attention_layernorm" in result.summary, result.summary


def test_a_fault_that_starts_mid_decode_is_located_at_its_step() -> None:
    """Nudge one logit only once the cache holds prompt + 5 tokens: the gates name step 5."""
    first_bad = 5

    def hook(model) -> None:
        cls = type(model)

        def perturbed_call(self, inputs, cache=None):
            offset = cache[0].offset if cache else 0
            logits = cls.__call__(self, inputs, cache)
            if offset + inputs.shape[1] - 1 >= self.prompt_length - 1 + first_bad:
                logits = logits + mx.zeros(logits.shape[-1]).at[123].add(1e-3)
            return logits

        model.__class__ = type("LateFault", (cls,), {"__call__": perturbed_call})

    session = ParitySession(model_hook=hook)
    profile = session.profile(MODEL)
    scenario = profile.scenario("multi-turn")
    prompt_length = len(session.goldens(profile)[scenario.id].record.prompt_ids)
    session.runner(profile).model.prompt_length = prompt_length
    results = {
        c: session.run_check(profile, scenario, c) for c in ("prefill_logits", "decode_logits", "teacher_forced_logits")
    }
    assert results["prefill_logits"].passed
    for check in ("decode_logits", "teacher_forced_logits"):
        result = results[check]
        assert not result.passed and result.first_bad_step == first_bad, result.summary
        diff = result.details["first_step_diff"]
        assert diff["n_differing"] == 1 and diff["first_index"] == 123
        # The fault is added after the model graph: every tapped module agrees, and the report says so.
        where = result.details["localization"]
        assert where["module"] is None and where["row"] == first_bad, where
        assert "outside the model graph" in result.summary


def test_a_run_that_does_not_stop_at_eos_fails_eos_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """`stop: eos` (issue 15): an in-tree loop that ignores EOS runs its full step budget; the
    oracle's stream_generate stopped at step 7. eos_stop says so, and the logits gates see a
    longer trajectory as a wrong tensor, not as 8 identical rows."""
    from harness.runners.llama import LlamaRunner

    collect = LlamaRunner._collect
    monkeypatch.setattr(
        LlamaRunner, "_collect", lambda self, steps, n, *a, stop=None, **k: collect(self, steps, n, *a, **k)
    )
    results = judge(None, "chat-stops-at-eos", "eos_stop", "decode_logits", "greedy_tokens")
    eos = results["eos_stop"]
    assert not eos.passed and "oracle after 8 tokens (stop), in-tree after 33 tokens (length)" in eos.summary, (
        eos.summary
    )
    assert (
        not results["decode_logits"].passed
        and "in-tree produced 33 logits rows, the oracle 8" in results["decode_logits"].summary
    )
    # The 7 decode rows both made are identical: the fault is where the loop stopped, not a
    # module, and the summary says so instead of localizing a row the oracle never made.
    decode = results["decode_logits"]
    assert decode.first_bad_step == 8 and "where the oracle stopped" in decode.summary, decode.summary
    assert "localization" not in decode.details
    assert not results["greedy_tokens"].passed
