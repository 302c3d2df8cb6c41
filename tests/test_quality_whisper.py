"""Whisper quantization quality (harness/quality/whisper.py): the candidate build, the metric code
on constructed inputs, and the measured pairs: whisper-tiny-en's real weights against MLX's own
8- and 4-bit quantization of them, computed by mlx-whisper in its venv and cross-checked bit for
bit by the in-tree Whisper; the identical pair and a perturbed in-tree model on the mini twin
(width 64: cheap).

The refblas CPU encoder costs ~24 s of CPU a 30 s window at tiny.en's size, and a pair costs
four encoder passes a window (control and candidate, oracle and in-tree; the teacher-forced
runs reuse their free run's): the real pairs run once per module, on two short clips.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import harness.quality.whisper as quality
from harness.artifacts.files import check_files
from harness.artifacts.resolve import resolve_artifact
from harness.errors import ArtifactError, HarnessError
from harness.paths import REPO_ROOT, oracles_dir
from harness.profile.load import find_profile
from harness.quality.whisper import build_whisper_candidate, measure_whisper_pair
from harness.quality.whisper_intree import InTreeFigures, compare
from harness.quality.whisper_metrics import argmax_per_step, kl_per_step, normalize_words, word_errors

FOX = REPO_ROOT / "fixtures" / "audio" / "fox.wav"
TINY = "whisper-tiny-en"
MINI = "whisper-large-v3-turbo-mini"


def one_ulp_up(array: mx.array) -> mx.array:
    values = np.array(array)
    values.flat[0] = np.nextafter(values.flat[0], np.float32(np.inf))
    return mx.array(values)


# --------------------------------------------------------------------------- metrics


def test_kl_of_identical_logits_is_exactly_zero_and_all_agree() -> None:
    logits = np.random.default_rng(0).normal(size=(5, 300)).astype(np.float32) * 4
    assert kl_per_step(logits, logits.copy()).tolist() == [0.0] * 5
    assert np.array_equal(argmax_per_step(logits), argmax_per_step(logits.copy()))


def test_kl_matches_a_float64_reference() -> None:
    rng = np.random.default_rng(1)
    p_logits = rng.normal(size=(7, 1000)).astype(np.float32) * 3
    q_logits = (p_logits + rng.normal(size=p_logits.shape).astype(np.float32) * 0.5).astype(np.float32)

    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        m = x.max(axis=-1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))

    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    reference = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    got = kl_per_step(p_logits, q_logits)
    assert got.dtype == np.float32 and np.all(got > 0)
    np.testing.assert_allclose(got, reference, rtol=1e-4)
    # Direction: KL(control || candidate), not the reverse.
    assert not np.allclose(kl_per_step(q_logits, p_logits), got, rtol=1e-3)


def test_agreement_counts_argmax_differences() -> None:
    logits = np.zeros((6, 10), np.float32)
    logits[np.arange(6), [1, 2, 3, 4, 5, 6]] = 1.0
    other = logits.copy()
    other[[1, 4], :] = 0.0
    other[[1, 4], [9, 0]] = 2.0
    agree = argmax_per_step(logits) == argmax_per_step(other)
    assert agree.tolist() == [True, False, True, True, False, True]


def test_normalizer_and_word_errors() -> None:
    assert normalize_words("The quick, brown fox's 'jump' -- OVER!") == [
        "the",
        "quick",
        "brown",
        "fox's",
        "jump",
        "over",
    ]
    assert word_errors("The quick brown fox.", "the quick brown fox") == (0, 4)
    assert word_errors("the quick brown fox", "the quick fox jumps") == (2, 4)  # a deletion, an insertion
    assert word_errors("a b c", "x y") == (3, 3)
    assert word_errors("", "a b") == (2, 0)


def _figures(kl: list[float]) -> InTreeFigures:
    return InTreeFigures(
        control_text=" A b.",
        candidate_text=" A c.",
        control_tokens=[1, 2, 3],
        candidate_tokens=[1, 4, 3],
        control_row_sha256=["a", "b", "c"],
        forced_row_sha256=["d", "e", "f"],
        kl=np.array(kl, np.float32),
        control_top1=np.array([1, 2, 3]),
        candidate_top1=np.array([1, 4, 3]),
    )


def test_compare_names_the_first_difference() -> None:
    ours = _figures([0.5, 0.25, 0.125])
    record = {
        "control": {"text": " A b.", "tokens": [1, 2, 3], "row_sha256": ["a", "b", "c"]},
        "candidate": {"text": " A c.", "tokens": [1, 4, 3], "forced_row_sha256": ["d", "e", "f"]},
        "kl": np.array([0.5, 0.25, 0.125], np.float32),
        "control_top1": np.array([1, 2, 3]),
        "candidate_top1": np.array([1, 4, 3]),
    }
    assert compare("fox", ours, record) == "equal"
    nudged = np.array([0.5, 0.25, np.nextafter(np.float32(0.125), np.float32(1))], np.float32)
    assert compare("fox", ours, record | {"kl": nudged}) == "differs: fox: KL at step 2"
    forced = record["candidate"] | {"forced_row_sha256": ["d", "x", "f"]}
    assert compare("fox", ours, record | {"candidate": forced}) == (
        "differs: fox: candidate teacher-forced logits at step 1"
    )
    short = record["control"] | {"row_sha256": ["a", "b"]}
    assert compare("fox", ours, record | {"control": short}) == (
        "differs: fox: control logits at 3 steps in-tree, 2 in the oracle"
    )
    text = record["candidate"] | {"text": " A d."}
    assert compare("fox", ours, record | {"candidate": text}).startswith("differs: fox: candidate transcript")


# --------------------------------------------------------------------------- the oracle's spec check


def test_the_oracle_refuses_a_spec_that_is_not_greedy(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("mlx_whisper_quality", oracles_dir() / "mlx-whisper" / "quality.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "weights.safetensors").write_bytes(b"")
    scenario = {"id": "fox", "kind": "transcribe", "audio": str(FOX), "seed": 0}
    good = {"control_dir": str(model), "candidate_dir": str(model), "scenarios": [scenario]}
    with pytest.raises(module.spec_check.SpecError) as e:
        module.validate_spec(good | {"scenarios": [scenario | {"options": {"temperature": [0.0, 0.2]}}]})
    assert "candidate_dir: the same directory as control_dir" in str(e.value)
    assert "options.temperature: quality runs greedy, expected 0.0" in str(e.value)
    missing = good | {"candidate_dir": str(tmp_path / "nowhere")}
    with pytest.raises(module.spec_check.SpecError, match="candidate_dir: model_dir: .*nowhere: no such directory"):
        module.validate_spec(missing | {"scenarios": [scenario | {"options": {"temperature": 0.0}}]})


# --------------------------------------------------------------------------- the candidate


@pytest.fixture(scope="module")
def mini_control() -> Path:
    return resolve_artifact(find_profile(MINI)).model_dir


def test_candidate_refuses_bad_settings(mini_control: Path, tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="bits: expected one of"):
        build_whisper_candidate(mini_control, bits=7)
    with pytest.raises(ArtifactError, match="group_size: expected 32, 64 or 128"):
        build_whisper_candidate(mini_control, bits=4, group_size=48)
    with pytest.raises(ArtifactError, match="no config.json"):
        build_whisper_candidate(tmp_path, bits=4)


def test_candidate_is_built_once_mended_when_corrupt_and_refuses_a_quantized_control(
    isolated: Path, mini_control: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = isolated / "control"
    shutil.copytree(mini_control, control)
    first = build_whisper_candidate(control, bits=8)
    assert first.parent == isolated / "cache" / "artifacts" and first.name.startswith("whisper-q8-g64-")
    made = json.loads((first / "quantized.json").read_text())
    assert made["quantized_in"] == "float32"  # seeded random weights are not float16 values
    assert "decoder.token_embedding" in made["modules"] and "encoder.conv1" not in made["modules"]
    assert set(p.name for p in first.iterdir() if not p.name.startswith(".")) == {
        "config.json",
        "weights.safetensors",
        "quantized.json",
        "multilingual.tiktoken",
        "twin.json",
    }

    import harness.quality.whisper_candidate as candidate

    def no_rebuild(*args, **kwargs):
        raise AssertionError("rebuilt an intact candidate")

    with monkeypatch.context() as patch:
        patch.setattr(candidate, "quantize_whisper_dir", no_rebuild)
        assert build_whisper_candidate(control, bits=8) == first  # reused, not rebuilt
    weights = first / "weights.safetensors"
    original = weights.read_bytes()
    weights.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))  # a corrupt cache file: made again
    assert check_files(first) != []
    assert build_whisper_candidate(control, bits=8) == first
    assert check_files(first) == [] and weights.read_bytes() == original  # the same bytes, rebuilt
    other = build_whisper_candidate(control, bits=4)
    assert other != first and other.name.startswith("whisper-q4-g64-")
    with pytest.raises(ArtifactError, match="already quantized"):
        build_whisper_candidate(first, bits=4)


# --------------------------------------------------------------------------- measured pairs


@pytest.fixture(scope="module")
def tiny() -> dict:
    """whisper-tiny-en: the control, its 8- and 4-bit candidates and their figures (once)."""
    profile = find_profile(TINY)
    control = resolve_artifact(profile).model_dir
    q8, q4 = build_whisper_candidate(control, bits=8), build_whisper_candidate(control, bits=4)
    return {
        "control": control,
        "q8": q8,
        "q8_again": build_whisper_candidate(control, bits=8),
        # One measured pair in make test (six transcriptions of fox, ~3 min here): the 4-bit one, whose
        # arrays are not trivial (KL ~0.14, 2 of 13 argmaxes differ); make quality runs them all.
        "4": measure_whisper_pair(profile=profile, control_dir=control, candidate_dir=q4, fixtures=[FOX]),
    }


@pytest.mark.nightly  # make test's 30-minute budget (docs/benchmarks.md): make test-nightly
@pytest.mark.slow
@pytest.mark.xdist_group(TINY)
def test_tiny_candidates_are_mlx_quantized_float16_values(tiny: dict) -> None:
    assert tiny["q8_again"] == tiny["q8"]
    config = json.loads((tiny["q8"] / "config.json").read_text())
    assert config["quantization"] == {"group_size": 64, "bits": 8}
    assert json.loads((tiny["q8"] / "quantized.json").read_text())["quantized_in"] == "float16"
    weights = mx.load(str(tiny["q8"] / "weights.safetensors"))
    scales = weights["decoder.blocks.0.mlp1.scales"]
    assert scales.dtype == mx.float32 and mx.array_equal(scales.astype(mx.float16).astype(mx.float32), scales)
    control = mx.load(str(tiny["control"] / "weights.safetensors"))
    assert mx.array_equal(weights["encoder.conv1.weight"], control["encoder.conv1.weight"])  # kept bit for bit


@pytest.mark.nightly  # make test's 30-minute budget (docs/benchmarks.md): make test-nightly
@pytest.mark.slow
@pytest.mark.xdist_group(TINY)
def test_tiny_pairs_measured_and_cross_checked(tiny: dict) -> None:
    (q,) = tiny["4"]
    assert q.fixture == "fixtures/audio/fox.wav"
    assert q.cross_check == "equal", q.cross_check
    assert q.steps > 3 and q.kl.dtype == np.float64 and q.top1_agree.dtype == bool
    assert q.top1_agree.shape == q.kl.shape
    assert np.all(q.kl >= 0), q.kl.min()
    assert q.kl.mean() > 0  # 4 bits moves the logits (docs/quality-whisper.md: mean KL 0.137 on fox)
    assert q.control_text.strip() and q.reference_words > 3


@pytest.mark.nightly  # make test's 30-minute budget (docs/benchmarks.md): make test-nightly
@pytest.mark.slow
@pytest.mark.xdist_group(MINI)
def test_identical_pair_has_zero_kl_and_a_perturbed_in_tree_candidate_differs(
    mini_control: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profile = find_profile(MINI)
    same = tmp_path / "same"
    shutil.copytree(mini_control, same)  # the control's files under another path
    records = []
    real_run_oracle = quality.run_oracle
    monkeypatch.setattr(quality, "run_oracle", lambda *args: records.append(real_run_oracle(*args)) or records[-1])
    (q,) = measure_whisper_pair(profile=profile, control_dir=mini_control, candidate_dir=same, fixtures=[FOX])
    assert q.steps > 0 and q.kl.tolist() == [0.0] * q.steps and q.top1_agree.all()
    assert q.candidate_text == q.control_text and q.word_errors == 0
    assert q.cross_check == "equal"

    def nudge(model) -> None:  # one ULP in the in-tree candidate's final decoder norm
        model.decoder.ln.weight = one_ulp_up(model.decoder.ln.weight)

    # The oracle's figures are the same (its run is not repeated); the in-tree candidate is nudged.
    monkeypatch.setattr(quality, "run_oracle", lambda *args: records[0])
    (p,) = measure_whisper_pair(
        profile=profile, control_dir=mini_control, candidate_dir=same, fixtures=[FOX], candidate_hook=nudge
    )
    assert p.cross_check == "differs: fox: candidate teacher-forced logits at step 0", p.cross_check


def test_pair_refuses_bad_input(mini_control: Path, tmp_path: Path) -> None:
    profile = find_profile(MINI)
    with pytest.raises(HarnessError, match="is the control itself"):
        measure_whisper_pair(profile=profile, control_dir=mini_control, candidate_dir=mini_control, fixtures=[FOX])
    other = tmp_path / "other"
    shutil.copytree(mini_control, other)
    vocabulary = other / "multilingual.tiktoken"
    vocabulary.write_bytes(vocabulary.read_bytes() + b"\n")
    with pytest.raises(HarnessError, match=r"differ in \['multilingual.tiktoken'\]"):
        measure_whisper_pair(profile=profile, control_dir=mini_control, candidate_dir=other, fixtures=[FOX])
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(config | {"n_text_layer": 3}))
    with pytest.raises(HarnessError, match="are not the same model"):
        measure_whisper_pair(profile=profile, control_dir=mini_control, candidate_dir=other, fixtures=[FOX])
    with pytest.raises(HarnessError, match="have the same name 'fox'"):
        quality._fixture_ids([FOX, Path("elsewhere/fox.wav")])
