"""Hostile inputs of the probe (docs of the defects: shared review "hostile-probe", items 6, 10,
11, 12, 15, 16): each ends in one clear error naming the thing and what was expected, before
any work starts, never in a traceback or a silent acceptance."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from harness.errors import HarnessError, ProfileError
from harness.fileio import atomic_create_json, atomic_write_json
from harness.paths import REPO_ROOT
from harness.profile.load import load_profile
from harness.records import CompactLogits
from tests.conftest import VALID_PROFILE, write_profile

SPEECH_PROFILE = """\
name: tiny
implementation: whisper
tier: L1
oracle: mlx-whisper
artifact:
  source: hub
  repo: example-org/tiny-whisper
  revision: 0123456789abcdef0123456789abcdef01234567
scenarios:
  - id: fox
    audio: fixtures/audio/fox.wav
{extra}
"""


def _load_error(root: Path, text: str) -> str:
    path = write_profile(root, text=text)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert str(path) in message
    return message


# --------------------------------------------------------------------------- item 6: not UTF-8


def test_a_non_utf8_byte_is_a_profile_error_naming_the_file_and_the_byte_offset(isolated: Path) -> None:
    text = VALID_PROFILE.format(name="tiny").encode()
    offset = text.index(b"Hello")
    path = isolated / "profiles" / "tiny.yaml"
    path.write_bytes(text[:offset] + b"\xff" + text[offset:])
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert str(path) in message and f"byte {offset}" in message and "UTF-8" in message


def test_list_shows_a_non_utf8_profile_as_invalid_without_a_traceback(isolated: Path) -> None:
    write_profile(isolated)
    (isolated / "profiles" / "latin1.yaml").write_bytes(
        VALID_PROFILE.format(name="latin1").replace("Hello", "caf\xe9").encode("latin-1")
    )
    result = subprocess.run(
        [sys.executable, "-m", "harness", "list"], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Traceback" not in output and "UnicodeDecodeError" not in output
    assert re.search(r"latin1\s+INVALID: .*latin1\.yaml: .*not UTF-8.*byte \d+", output), output
    assert re.search(r"^tiny\s", result.stdout, re.MULTILINE), output  # the valid one is still listed


def test_a_non_utf8_vad_profile_is_a_profile_error(tmp_path: Path) -> None:
    from harness.profile.vad import load_vad_profile

    source = REPO_ROOT / "profiles" / "vad" / "silero-vad.yaml"
    path = tmp_path / "silero-vad.yaml"
    path.write_bytes(b"# \xfe\n" + source.read_bytes())
    with pytest.raises(ProfileError, match=rf"{re.escape(str(path))}: .*byte 2.*UTF-8"):
        load_vad_profile(path)


# --------------------------------------------------------------------------- item 11: key types


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        (lambda t: t + "1: x\nzzz: y\n", "(top level)"),
        (lambda t: t.replace("    steps: 3\n", "    steps: 3\n    1: x\n    zzz: y\n"), "scenarios[0]"),
        (lambda t: t.replace("  source: hub\n", "  source: hub\n  2: x\n"), "artifact"),
        (
            lambda t: t.replace("  - id: chat\n", "  - id: chat\n    template_kwargs: {a: {1: x, zzz: y}}\n"),
            "scenarios[1].template_kwargs.a",
        ),
        (
            lambda t: t.replace(
                '    prompt: "Hello"\n',
                '    prompt: "Hello"\n    draft: {num_draft_tokens: 2, artifact: {source: hub, 1: x}}\n',
            ),
            "scenarios[0].draft.artifact",
        ),
    ],
)
def test_mixed_type_keys_are_a_profile_error_naming_the_key_path(isolated: Path, edit, where: str) -> None:
    message = _load_error(isolated, edit(VALID_PROFILE.format(name="tiny")))
    assert where in message and "keys must be strings" in message, message


def test_a_mixed_key_budget_is_a_profile_error(isolated: Path) -> None:
    extra = "    composition: {kind: whisper-fast, budget: {max_differing_tokens: 0, 1: x}}\n    checks: [token_budget]"
    message = _load_error(isolated, SPEECH_PROFILE.format(extra=extra))
    assert "scenarios[0].composition.budget" in message and "keys must be strings" in message


# --------------------------------------------------------------------------- item 10: bounds


@pytest.fixture
def in_repo() -> Iterator[Path]:
    """A scratch folder inside the repository (audio paths must resolve inside it)."""
    scratch = REPO_ROOT / ".cache" / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="probe-inputs-", dir=scratch) as tmp:
        yield Path(tmp)


def _wav(path: Path, frames: int, *, channels: int = 1, width: int = 2) -> Path:
    data = b"\x01\x00" * frames * channels * (width // 2)
    fmt = struct.pack("<HHIIHH", 1, channels, 16000, 16000 * channels * width, channels * width, 8 * width)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)
    return path


def _speech_with_audio(audio: str) -> str:
    return SPEECH_PROFILE.format(extra="    checks: [mel]").replace("fixtures/audio/fox.wav", audio)


def test_a_text_file_as_audio_is_refused_at_load(isolated: Path) -> None:
    message = _load_error(isolated, _speech_with_audio("README.md"))
    assert "scenarios[0].audio" in message and "README.md" in message and "RIFF/WAVE" in message


@pytest.mark.parametrize("content", ["empty-file", "header-only", "half-a-frame"])
def test_an_audio_file_without_a_sample_frame_is_refused_at_load(isolated: Path, in_repo: Path, content: str) -> None:
    clip = in_repo / "clip.wav"
    if content == "empty-file":
        clip.write_bytes(b"")
    else:
        _wav(clip, 0)
        if content == "half-a-frame":  # one byte of a two-byte frame
            raw = bytearray(clip.read_bytes())
            raw[40:44] = struct.pack("<I", 1)
            clip.write_bytes(bytes(raw) + b"\x00")
    message = _load_error(isolated, _speech_with_audio(str(clip.relative_to(REPO_ROOT))))
    assert "scenarios[0].audio" in message and "WAV" in message


def test_a_one_frame_wav_and_the_fixtures_load(isolated: Path, in_repo: Path) -> None:
    clip = _wav(in_repo / "one.wav", 1, channels=2)
    assert load_profile(write_profile(isolated, text=_speech_with_audio(str(clip.relative_to(REPO_ROOT)))))
    for fixture in sorted((REPO_ROOT / "fixtures" / "audio").glob("*.wav")):
        rel = str(fixture.relative_to(REPO_ROOT))
        assert load_profile(write_profile(isolated, text=_speech_with_audio(rel))).scenarios[0].audio == rel


def test_quality_fixtures_must_be_wav_files(isolated: Path) -> None:
    quality = textwrap.dedent(
        """\
        quality:
          fixtures: [README.md]
          pairs:
            - id: q8
              control: {artifact: profile}
              candidate: {artifact: profile, requantize: {bits: 8, group_size: 64}}
        """
    )
    message = _load_error(isolated, _speech_with_audio("fixtures/audio/fox.wav") + quality)
    assert "quality.fixtures[0]" in message and "RIFF/WAVE" in message


LLM = VALID_PROFILE.format(name="tiny")


def _scenario(option: str) -> str:
    return LLM.replace('    prompt: "Hello"\n', f'    prompt: "Hello"\n    {option}\n')


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (LLM.replace("steps: 3", "steps: 1000000000"), r"scenarios[0].steps: expected an integer in [1, 4096]"),
        (LLM.replace("steps: 3", "steps: 0"), r"scenarios[0].steps: expected an integer in [1, 4096]"),
        (LLM + "defaults: {steps: 5000}\n", "defaults.steps: expected an integer in [1, 4096]"),
        (
            _scenario("prefill_step_size: 0"),
            "scenarios[0].prefill_step_size: expected an integer >= 1 (prompt tokens per prefill chunk), got 0",
        ),
        (LLM + "defaults: {prefill_step_size: -3}\n", "defaults.prefill_step_size: expected an integer >= 1"),
        (_scenario("forced_prefix: [5, -1]"), "scenarios[0].forced_prefix[1]: expected a token id >= 0, got -1"),
        (_scenario("kv_bits: 8\n    kv_group_size: 0"), "scenarios[0].kv_group_size: expected one of [32, 64, 128]"),
        (_scenario("kv_bits: 8\n    quantized_kv_start: -1"), "scenarios[0].quantized_kv_start: expected >= 0"),
        (
            _scenario("composition: {kind: fused_sdpa, kv_bits: 8, n_chunk: 0}"),
            "scenarios[0].composition: n_chunk: expected an int >= 1, got 0",
        ),
        (
            _scenario("composition: {kind: ngram_draft, num_draft_tokens: 0}"),
            "scenarios[0].composition: num_draft_tokens: expected an int >= 1, got 0",
        ),
        (
            _scenario("composition: {kind: ngram_draft, ngram_min: 0}"),
            "scenarios[0].composition: ngram_min: expected an int >= 1, got 0",
        ),
        (
            _scenario("composition: {kind: rotating_quantized_kv, max_kv_size: 24, keep: -2, kv_bits: 4}"),
            "scenarios[0].composition: keep: expected an int >= 0, got -2",
        ),
        (
            _scenario("composition: {kind: streaming_kv, kv_bits: 8, quantized_kv_start: -5}"),
            "scenarios[0].composition: quantized_kv_start: expected an int >= 0, got -5",
        ),
        (
            _scenario("composition: {kind: mixed_kv, kv_config: [{layer_idx: -1, bits: 8}]}"),
            "scenarios[0].composition: kv_config[0].layer_idx: expected an int >= 0, got -1",
        ),
    ],
)
def test_integer_knobs_are_bounded_at_load(isolated: Path, text: str, message: str) -> None:
    assert message in _load_error(isolated, text)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("    seed: -1\n    checks: [mel]", "scenarios[0].seed: expected an integer in [0, 2**64 - 1], got -1"),
        (
            "    options: {beam_size: 0}\n    checks: [mel]",
            "scenarios[0].options.beam_size: expected an integer >= 1, got 0",
        ),
        (
            "    options: {best_of: -1, temperature: 0.5}\n    checks: [mel]",
            "scenarios[0].options.best_of: expected an integer >= 1",
        ),
        (
            "    options: {sample_len: 0}\n    checks: [mel]",
            "scenarios[0].options.sample_len: expected an integer >= 1, got 0",
        ),
        (
            "    options: {beam_size: '5'}\n    checks: [mel]",
            "scenarios[0].options.beam_size: expected an integer >= 1, got '5'",
        ),
        (
            "    writer_options: {max_line_width: 0}\n    checks: [writers]",
            "scenarios[0].writer_options.max_line_width: expected an integer >= 1, got 0",
        ),
        (
            "    writer_options: {max_words_per_line: -2}\n    checks: [writers]",
            "scenarios[0].writer_options.max_words_per_line: expected an integer >= 1, got -2",
        ),
        (
            "    writer_options: {highlight_words: 1}\n    checks: [writers]",
            "scenarios[0].writer_options.highlight_words: expected a boolean, got 1",
        ),
        (
            "    writer_options: {colour: red}\n    checks: [writers]",
            "scenarios[0].writer_options: unknown key(s) ['colour']",
        ),
    ],
)
def test_speech_integer_knobs_are_bounded_at_load(isolated: Path, extra: str, message: str) -> None:
    assert message in _load_error(isolated, SPEECH_PROFILE.format(extra=extra))


def test_speech_default_options_are_bounded_at_load(isolated: Path) -> None:
    text = SPEECH_PROFILE.format(extra="    checks: [mel]") + "defaults: {options: {beam_size: 0}}\n"
    assert "defaults.options.beam_size: expected an integer >= 1, got 0" in _load_error(isolated, text)


def test_a_quality_kv_keep_is_bounded(isolated: Path) -> None:
    quality = textwrap.dedent(
        """\
        quality:
          corpus: {path: fixtures/corpus/kjv-genesis-1-12.txt, context: 64, chunk: 16}
          pairs:
            - id: rot
              control: {artifact: profile}
              candidate: {artifact: profile, kv: {max_kv_size: 32, keep: -1}}
        """
    )
    message = _load_error(isolated, LLM + quality)
    assert "quality.pairs[0].candidate.kv.keep: expected >= 0 (positions never evicted), got -1" in message


def test_the_shipped_bounds_hold_for_the_tracked_profiles() -> None:
    for path in sorted((REPO_ROOT / "profiles").glob("*.yaml")):
        assert load_profile(path).name == path.stem


# --------------------------------------------------------------------------- item 12: make


@pytest.fixture
def fake_venv(tmp_path: Path) -> Path:
    """A venv whose python records its argv and exits 3 (a failing harness)."""
    if shutil.which("make") is None:
        pytest.skip("no make command")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(tmp_path / 'argv.json')!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\nsys.exit(3)\n"
    )
    python.chmod(0o755)
    (venv / ".installed").touch()  # newer than requirements.txt: make builds nothing
    return venv


def _make(venv: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    result = subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO_ROOT), f"VENV={venv}", *args],
        capture_output=True,
        text=True,
        check=False,
        env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")},
    )
    log = venv.parent / "argv.json"
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, calls


@pytest.mark.parametrize("target", ["parity", "goldens", "quality", "bench", "calibrate"])
def test_make_passes_model_as_one_word_and_keeps_the_exit_status(fake_venv: Path, target: str) -> None:
    pwned = fake_venv.parent / "pwned"
    model = f"a b; touch {pwned}; echo 'q\"uote'"
    result, calls = _make(fake_venv, target, f"MODEL={model}")
    assert not pwned.exists(), "MODEL ran as shell code"
    assert result.returncode != 0, result.stdout + result.stderr  # the harness's failure is not hidden
    assert len(calls) == 1 and calls[0][calls[0].index("--model") + 1] == model, calls


@pytest.mark.parametrize(("target", "variable"), [("signoff", "SIGNOFF_MODELS"), ("nightly", "NIGHTLY_MODELS")])
def test_make_model_lists_cannot_run_shell_code(fake_venv: Path, target: str, variable: str) -> None:
    pwned = fake_venv.parent / "pwned"
    # `$$` is make's escape of `$`: unquoted, the shell would run `touch${IFS}<pwned>`.
    result, calls = _make(fake_venv, target, f"{variable}=smollm2-135m x;touch$${{IFS}}{pwned}")
    assert not pwned.exists(), f"{variable} ran as shell code"
    assert result.returncode != 0
    (argv,) = calls
    models = [argv[i + 1] for i, a in enumerate(argv) if a == "--model"]
    assert models == ["smollm2-135m", f"x;touch${{IFS}}{pwned}"], argv


def test_make_test_workers_cannot_run_shell_code(fake_venv: Path) -> None:
    pwned = fake_venv.parent / "pwned"
    result, calls = _make(fake_venv, "test", f"WORKERS=2; touch {pwned}")
    assert not pwned.exists() and result.returncode != 0
    assert calls[0][calls[0].index("-n") + 1] == f"2; touch {pwned}"


# --------------------------------------------------------------------------- item 15: strict JSON


def _strict(text: str) -> object:
    def refuse(constant: str) -> None:
        raise ValueError(f"not RFC 8259 JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_written_json_is_strict_and_reads_back_as_the_same_floats(tmp_path: Path) -> None:
    logits = np.array([[0.0, -np.inf, -np.inf, 1.5], [np.nan, 2.0, -np.inf, np.inf]], np.float32)
    compact = CompactLogits.of(logits, 3, 0)
    path = tmp_path / "manifest.json"
    atomic_write_json(path, {"compact": compact.as_json(), "n": [float("inf"), -0.0, 1e-300]})
    text = path.read_text()
    strict = _strict(text)  # no bare NaN / Infinity / -Infinity
    assert strict["n"][0] == "Infinity" and math.copysign(1, strict["n"][1]) == -1 and strict["n"][2] == 1e-300
    back = CompactLogits.from_json(json.loads(text)["compact"], str(path))
    assert back.row_sha256 == compact.row_sha256 and back.topk_ids == compact.topk_ids
    for got, want in zip(back.topk_values + [back.logsumexp], compact.topk_values + [compact.logsumexp], strict=True):
        assert len(got) == len(want)
        assert all((math.isnan(a) and math.isnan(b)) or a == b for a, b in zip(got, want, strict=True)), (got, want)
    assert any(math.isinf(v) for row in back.topk_values for v in row)


def test_written_json_keeps_finite_output_byte_for_byte(tmp_path: Path) -> None:
    obj = {"b": [1, 2.5, "NaN", None, True], "a": {"x": 1e-7}}
    atomic_write_json(tmp_path / "x.json", obj)
    assert (tmp_path / "x.json").read_text() == json.dumps(obj, indent=2, sort_keys=True) + "\n"


def test_create_json_is_strict_too(tmp_path: Path) -> None:
    atomic_create_json(tmp_path / "r.json", {"v": float("-inf")})
    assert _strict((tmp_path / "r.json").read_text()) == {"v": "-Infinity"}


def test_tracked_manifests_with_bare_infinity_still_read(tmp_path: Path) -> None:
    from harness.goldens.store import GoldenStore

    (path,) = (REPO_ROOT / "goldens" / "minicpm5-2b-mini").glob("*/l2-ngram-draft.json")
    assert "-Infinity" in path.read_text()
    store = GoldenStore(REPO_ROOT / "goldens", tmp_path / "blobs", path.parent.name)
    manifest = store.read_manifest("minicpm5-2b-mini", "l2-ngram-draft")
    compact = CompactLogits.from_json(manifest["compact"]["logits"], str(path))
    assert any(v == -math.inf for row in compact.topk_values for v in row)


# --------------------------------------------------------------------------- item 16: ffmpeg


def test_calibrate_without_ffmpeg_is_a_clear_error_before_any_work(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import harness.tools.calibrate as calibrate
    from harness.cli import main as harness_main

    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda cmd, *a, **k: None if cmd == "ffmpeg" else real_which(cmd, *a, **k))

    def no_work(*args, **kwargs):
        raise AssertionError("calibration work started without ffmpeg")

    monkeypatch.setattr(calibrate, "fast_runs", no_work)
    monkeypatch.setattr(calibrate, "run_oracle", no_work)
    assert harness_main(["calibrate", "--model", "whisper-tiny-en"]) == 2
    err = capsys.readouterr().err
    assert "ffmpeg" in err and "apt-get install ffmpeg" in err and "brew install ffmpeg" in err
    assert "Traceback" not in err


def test_calibrate_checks_ffmpeg_with_a_harness_error() -> None:
    from harness.tools.calibrate import require_ffmpeg

    with pytest.raises(HarnessError, match="ffmpeg"):
        require_ffmpeg(which=lambda _: None)
    require_ffmpeg(which=lambda cmd: f"/usr/bin/{cmd}")
