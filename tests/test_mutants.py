"""`make mutants`: judged through the session's own path, and a matrix with no check unkilled."""

from __future__ import annotations

import ast
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from harness.checks.compare import CheckResult
from harness.checks.registry import CHECKS
from harness.cli import main as harness_main
from harness.errors import InTreeRunError, OracleError
from harness.paths import REPO_ROOT
from harness.profile.load import find_profile
from harness.session import ParitySession
from harness.tools import mutant_faults as fault
from harness.tools import mutants


def test_every_mutant_names_a_scenario_of_its_profile() -> None:
    for mutant in mutants.MUTANTS:
        for model in mutant.models():  # its own and every model it can be judged on (--model)
            retargeted = mutant.judged_on(model)
            assert find_profile(model).scenario(retargeted.scenario).id == retargeted.scenario


def test_model_retargets_the_chosen_mutants_and_refuses_one_without_a_scenario_there() -> None:
    chosen = mutants.choose(["final-norm-eps,dequant-fused-sdpa", "one-ulp"], "minicpm5-2b-mini-fp16")
    assert [(m.name, m.model, m.scenario) for m in chosen] == [
        ("one-ulp", "minicpm5-2b-mini-fp16", "chat-fp16"),
        ("final-norm-eps", "minicpm5-2b-mini-fp16", "chat-fp16"),
        ("dequant-fused-sdpa", "minicpm5-2b-mini-fp16", "kv8-from-prefill"),
    ]
    assert chosen[0].hook is fault.ulp_layer_norm
    with pytest.raises(ValueError, match=r"no scenario on minicpm5-2b-mini-fp16 for: fast-logits \(whisper-tiny-en\)"):
        mutants.choose(["fast-logits"], "minicpm5-2b-mini-fp16")
    with pytest.raises(ValueError, match=r"unknown mutants \['no-such'\]"):
        mutants.choose(["one-ulp,no-such"], None)
    assert harness_main(["mutants", "--only", "fast-logits", "--model", "minicpm5-2b-mini-fp16"]) == 2


def test_every_gate_test_named_in_the_matrix_exists() -> None:
    for check in CHECKS.values():
        for test in check.failing_tests:
            path, name = test.split("::")
            tree = ast.parse((REPO_ROOT / path).read_text())
            names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert name in names, f"{test} (named for {check.name}) does not exist"


def test_a_mutant_is_judged_by_run_check_on_every_declared_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """No check function is called directly: `ParitySession.run_check` (digests, full vectors on
    demand, errors) judges, and an error counts as caught, never as a pass; each check caught is
    judged again on the unmutated implementation (no edits), which passes it here."""
    seen = []

    def run_check(self: ParitySession, profile, scenario, check: str) -> CheckResult:
        edits = self.intree_spec_edits.get((profile.name, scenario.id))
        seen.append((check, edits))
        if check == "decode_logits" and edits:
            raise InTreeRunError("the in-tree run crashed")
        return CheckResult(check, check != "eos_stop" or not edits, "scripted")

    monkeypatch.setattr(ParitySession, "run_check", run_check)
    mutant = mutants.Mutant("m", "a fault", "minicpm5-2b-mini", "rotating-kv", spec_edits={"max_kv_size": 25})
    outcome = mutants.judge(mutant)
    profile = find_profile("minicpm5-2b-mini")
    declared = profile.checks(profile.scenario("rotating-kv"))
    assert seen[: len(declared)] == [(c, {"max_kv_size": 25}) for c in declared]
    assert sorted(seen[len(declared) :]) == sorted((c, None) for c in ("decode_logits", "eos_stop") if c in declared)
    assert outcome["killed"] and outcome["outcomes"]["decode_logits"] == "error"
    assert outcome["outcomes"].get("eos_stop", "failed") == "failed"
    assert mutants.verdict_of(outcome) == "KILLED"


def test_a_check_that_fails_on_the_unmutated_implementation_too_is_no_kill(monkeypatch: pytest.MonkeyPatch) -> None:
    """An oracle that cannot run a scenario (quantized KV on CUDA) fails the mutant's checks and
    the unmutated implementation's alike: unjudged, never killed."""

    def run_check(self: ParitySession, profile, scenario, check: str) -> CheckResult:
        if check == "decode_logits":
            raise OracleError("oracle mlx-lm cannot run it on this machine; no golden, nothing compared")
        return CheckResult(check, True, "scripted")

    monkeypatch.setattr(ParitySession, "run_check", run_check)
    mutant = mutants.Mutant("m", "a fault", "minicpm5-2b-mini", "kv4-from-prefill", spec_edits={"kv_group_size": 32})
    outcome = mutants.judge(mutant)
    assert outcome["outcomes"]["decode_logits"] == "unjudged" and not outcome["killed"]
    assert "unmutated: OracleError: oracle mlx-lm cannot run it" in outcome["summaries"]["decode_logits"]
    assert mutants.verdict_of(outcome) == "UNJUDGED"
    lines, _ = mutants.matrix({"m": outcome})
    assert any(line.startswith("| decode_logits | U |") for line in lines)


def test_the_matrix_names_every_check_without_a_kill() -> None:
    checks = mutants.registry()
    untested = [c for c in checks if not CHECKS[c].failing_tests]
    judged = {"a": {"outcomes": {untested[0]: "failed", untested[1]: "error"}}}
    lines, lacking = mutants.matrix(judged)
    assert untested[0] not in lacking and untested[1] in lacking  # an error is not a check failing
    assert set(lacking) == set(untested[1:])
    assert len(lines) == 2 + len(checks)
    assert lines[2 + checks.index(untested[0])].startswith(f"| {untested[0]} | K |")


def test_the_mutant_list_can_kill_every_check_of_the_registry() -> None:
    """Statically: every registry check is declared by some mutant's scenario or has a gate test
    (whether the mutant really kills it is what `make mutants` runs and docs/mutants.md records)."""
    declared = {c.name for c in CHECKS.values() if c.failing_tests}
    for m in mutants.MUTANTS:
        profile = find_profile(m.model)
        declared |= set(profile.checks(profile.scenario(m.scenario)))
    assert set(mutants.registry()) <= declared, sorted(set(mutants.registry()) - declared)
    assert Path(REPO_ROOT / "docs" / "mutants.md").is_file()


def test_one_ulp_moves_the_raw_bits_by_one_in_every_float_dtype() -> None:
    for dtype, unsigned in ((mx.float32, mx.uint32), (mx.float16, mx.uint16), (mx.bfloat16, mx.uint16)):
        weights = mx.array([0.75, -1.5, 2.0], dtype=dtype)
        up = fault._one_ulp_up(weights)
        assert up.dtype == dtype
        assert np.array(up.view(unsigned)).tolist() == (np.array(weights.view(unsigned)) + [1, 0, 0]).tolist()
        negative = fault._one_ulp_up(weights[1:])  # towards +inf: a negative value shrinks
        assert np.array(negative.view(unsigned))[0] == np.array(weights[1:].view(unsigned))[0] - 1
    assert np.array(fault._one_ulp_up(mx.array([0.37]))) == np.nextafter(np.float32(0.37), np.float32(np.inf))


def _attention_inputs(dtype: mx.Dtype) -> tuple[mx.array, mx.array, mx.array]:
    mx.random.seed(18)
    q, k, v = (mx.random.normal((1, 48, 64)) * 3 for _ in range(3))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def test_imprecise_softmax_changes_half_precision_whisper_attention_and_not_float32() -> None:
    from models.whisper.model import MultiHeadAttention

    attention = MultiHeadAttention(64, 2)
    for dtype, changed in ((mx.float16, True), (mx.float32, False)):
        q, k, v = _attention_inputs(dtype)
        clean, _ = attention.attend(q, k, v, None)
        with fault.imprecise_softmax():
            mutated, _ = attention.attend(q, k, v, None)
        assert (np.array(clean).tobytes() != np.array(mutated).tobytes()) == changed, dtype


def test_the_quantized_attention_faults_change_bfloat16_quantized_kv_attention() -> None:
    """imprecise-softmax and dequant-fused-sdpa both reach the quantized-KV attention the model
    calls (the module's name, looked up per call), and both change its bfloat16 bits."""
    import models.universal.model as llama

    q, k, v = (x.reshape(1, 48, 2, 32).transpose(0, 2, 1, 3) for x in _attention_inputs(mx.bfloat16))
    q_keys, q_values = mx.quantize(k, group_size=32, bits=8), mx.quantize(v, group_size=32, bits=8)

    def attend() -> bytes:
        out = llama.quantized_scaled_dot_product_attention(q, q_keys, q_values, 0.17, "causal", 32, 8)
        return np.array(out.astype(mx.float32)).tobytes()

    clean = attend()
    for patch in (fault.imprecise_softmax, fault.dequantize_then_fused_sdpa):
        with patch():
            assert attend() != clean, patch.__name__
        assert attend() == clean  # restored


def test_final_norm_eps_changes_the_final_norm_alone() -> None:
    from models.universal.config import LlamaConfig
    from models.universal.model import UniversalLlama

    config = LlamaConfig.from_dict(
        {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
         "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 32, "rms_norm_eps": 1e-5}
    )  # fmt: skip
    model = UniversalLlama(config)
    fault.final_norm_eps(model)
    assert model.model.norm.eps == pytest.approx(1e-6)
    assert all(n.eps == 1e-5 for layer in model.layers for n in (layer.input_layernorm, layer.post_attention_layernorm))
