"""The mlx-whisper oracle generator's spec check: bad input is refused with a clear error.

The generator runs in its own venv; its spec check uses the standard library only, so these
tests load it by path in the project venv, where mlx_whisper is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import wave
from pathlib import Path

import pytest

from harness.paths import oracles_dir

GENERATOR = oracles_dir() / "mlx-whisper" / "generate.py"
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "audio"


def load_generator():
    spec = importlib.util.spec_from_file_location("mlx_whisper_oracle_generate", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = load_generator()


def write_wav(path: Path, rate: int = 16000, channels: int = 1, seconds: float = 0.1) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\0\0" * channels * int(rate * seconds))
    return path


@pytest.fixture
def spec(tmp_path: Path) -> dict:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "weights.safetensors").write_bytes(b"")
    audio = write_wav(tmp_path / "clip.wav")
    return {
        "model_dir": str(model),
        "scenarios": [
            {
                "id": "clip",
                "kind": "transcribe",
                "audio": str(audio),
                "options": {"temperature": [0.0, 0.2], "fp16": False, "without_timestamps": True},
                "seed": 0,
            }
        ],
    }


def test_loading_the_generator_does_not_import_mlx_whisper(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaded where importing mlx_whisper (or mlx) fails outright: the spec check must not need it."""
    for name in ("mlx_whisper", "mlx", "mlx.core"):
        monkeypatch.setitem(sys.modules, name, None)  # `import name` now raises ImportError
    with pytest.raises(ImportError):
        import mlx_whisper  # noqa: F401 - proves the block is in force
    assert callable(load_generator().validate_spec)


def test_a_valid_spec_passes(spec: dict) -> None:
    gen.validate_spec(spec)


def test_the_committed_audio_fixtures_are_accepted(spec: dict) -> None:
    clips = sorted(FIXTURES.glob("*.wav"))
    assert clips, f"no fixtures in {FIXTURES}"
    spec["scenarios"] = [
        {"id": clip.stem, "kind": "transcribe", "audio": str(clip), "options": {}, "seed": 0} for clip in clips
    ]
    gen.validate_spec(spec)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "chat"}, r"scenario clip: kind: unknown kind 'chat' \(this oracle runs: transcribe\)"),
        ({"audio": "/nonexistent/clip.wav"}, r"scenario clip: audio: /nonexistent/clip.wav: no such file"),
        ({"audio": "clip.wav"}, r"audio: expected the absolute path of a 16 kHz WAV file, got 'clip.wav'"),
        ({"seed": "0"}, r"seed: expected an integer, got '0'"),
        ({"id": "../x"}, r"id: expected a file-name-safe string"),
        ({"options": {"beam": 5}}, r"options.beam: unknown option"),
        ({"options": {"verbose": True}}, r"options.verbose: set by the generator"),
        ({"options": {"fp16": "no"}}, r"options.fp16: expected true or false"),
        ({"options": {"temperature": []}}, r"options.temperature: expected a number >= 0"),
        ({"extra": 1}, r"unknown keys \['extra'\]"),
    ],
)
def test_bad_scenarios_are_refused_naming_the_problem(spec: dict, change: dict, message: str) -> None:
    spec["scenarios"][0].update(change)
    with pytest.raises(gen.SpecError, match=message):
        gen.validate_spec(spec)


def test_a_wav_of_the_wrong_format_is_refused(spec: dict, tmp_path: Path) -> None:
    spec["scenarios"][0]["audio"] = str(write_wav(tmp_path / "stereo44k.wav", rate=44100, channels=2))
    with pytest.raises(gen.SpecError, match=r"expected 16 kHz mono 16-bit PCM, got 44100 Hz, 2 channel\(s\)"):
        gen.validate_spec(spec)
    (tmp_path / "text.wav").write_text("not audio")
    spec["scenarios"][0]["audio"] = str(tmp_path / "text.wav")
    with pytest.raises(gen.SpecError, match=r"not a readable PCM WAV file"):
        gen.validate_spec(spec)


def test_every_problem_is_listed_at_once(spec: dict) -> None:
    spec["model_dir"] = "/nonexistent/model"
    spec["scenarios"].append(dict(spec["scenarios"][0]))
    with pytest.raises(gen.SpecError) as err:
        gen.validate_spec(spec)
    text = str(err.value)
    assert "model_dir: /nonexistent/model: no such directory" in text
    assert "scenario clip: duplicate id" in text


def test_empty_and_malformed_specs_are_refused() -> None:
    with pytest.raises(gen.SpecError, match=r"scenarios: expected a non-empty list"):
        gen.validate_spec({"model_dir": "/nonexistent", "scenarios": []})
    with pytest.raises(gen.SpecError, match=r"spec: expected an object"):
        gen.validate_spec([])


def test_the_generator_refuses_a_bad_spec_before_importing_mlx_whisper(spec: dict, tmp_path: Path) -> None:
    """As the harness runs it (`python -I`), in a venv without mlx_whisper: exit 2, the reason on stderr."""
    spec["scenarios"][0]["kind"] = "translate-everything"
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    out = subprocess.run(
        [sys.executable, "-I", str(GENERATOR), "--job", str(spec_path), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "unknown kind 'translate-everything'" in out.stderr
    assert "ModuleNotFoundError" not in out.stderr
