"""The openai-whisper oracle generator: its spec check refuses bad input with a clear error,
and its weight mapping (mlx-whisper directory -> openai-whisper state_dict) is strict.

The spec check and the safetensors reader need only the standard library and numpy, so they
are loaded by path in the project venv; the mapping onto openai-whisper's model runs in the
oracle's own venv (torch), on a tiny random model written here.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest

from harness.paths import oracles_dir

GENERATOR = oracles_dir() / "openai-whisper" / "generate.py"


def load_generator():
    spec = importlib.util.spec_from_file_location("openai_whisper_oracle_generate", GENERATOR)
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
                "options": {"temperature": 0.0, "beam_size": 5, "patience": 2.0, "length_penalty": 0.6},
                "seed": 0,
            }
        ],
    }


def test_a_valid_beam_spec_passes(spec):
    gen.validate_spec(spec)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"options": {"beam_size": 0}}, r"options.beam_size: expected an integer >= 1, got 0"),
        ({"options": {"beam_size": True}}, r"options.beam_size: expected an integer >= 1"),
        ({"options": {"patience": 2.0}}, r"options.patience: requires options.beam_size"),
        ({"options": {"beam_size": 5, "patience": 0}}, r"options.patience: expected a number > 0"),
        (
            {"options": {"beam_size": 5, "length_penalty": 1.5}},
            r"options.length_penalty: expected a number in \[0, 1\]",
        ),
        ({"options": {"beam_size": 5, "best_of": 5}}, r"options.best_of: cannot be given together"),
        ({"options": {"beam": 5}}, r"options.beam: unknown option"),
        ({"options": {"model": "x"}}, r"options.model: set by the generator"),
        ({"options": {"fp16": "no"}}, r"options.fp16: expected true or false"),
        ({"options": {"temperature": []}}, r"options.temperature: expected a number >= 0 or a non-empty list"),
        ({"kind": "generate"}, r"kind: unknown kind 'generate'"),
        ({"seed": "0"}, r"seed: expected an integer"),
        ({"id": "../x"}, r"id: expected a file-name-safe string"),
        ({"audio": "clip.wav"}, r"audio: expected the absolute path"),
        ({"audio_sha256": "0" * 64}, r"has sha256 .*, the spec expects 0000"),
        ({"extra": 1}, r"unknown keys \['extra'\]"),
    ],
)
def test_bad_scenarios_are_refused_by_name(spec, change, message):
    spec["scenarios"][0].update(change)
    with pytest.raises(gen.SpecError, match=message):
        gen.validate_spec(spec)


def test_a_stereo_wav_and_a_missing_model_are_refused(spec, tmp_path):
    spec["scenarios"][0]["audio"] = str(write_wav(tmp_path / "stereo.wav", channels=2))
    spec["model_dir"] = str(tmp_path / "nowhere")
    with pytest.raises(gen.SpecError) as raised:
        gen.validate_spec(spec)
    assert "expected 16 kHz mono 16-bit PCM, got 16000 Hz, 2 channel(s)" in str(raised.value)
    assert "nowhere: no such directory" in str(raised.value)


def test_the_generator_exits_2_on_a_bad_spec_before_importing_torch(spec, tmp_path):
    spec["scenarios"][0]["options"] = {"patience": 1.0}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    # The project venv has no torch: reaching an import of it would fail differently.
    out = subprocess.run(
        ["python3", "-I", str(GENERATOR), "--job", str(tmp_path / "spec.json"), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2 and "options.patience: requires options.beam_size" in out.stderr, out.stderr


def test_mlx_keys_map_to_openai_whisper_keys():
    assert gen.openai_key("decoder.blocks.3.mlp1.weight") == "decoder.blocks.3.mlp.0.weight"
    assert gen.openai_key("encoder.blocks.0.mlp2.bias") == "encoder.blocks.0.mlp.2.bias"
    assert gen.openai_key("decoder.blocks.0.cross_attn.key.weight") == "decoder.blocks.0.cross_attn.key.weight"


# --------------------------------------------------------------------------- weights


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    codes = {np.dtype("<f4"): "F32", np.dtype("<i8"): "I64"}
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {
            "dtype": codes[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


DIMS = {
    "n_mels": 8,
    "n_audio_ctx": 6,
    "n_audio_state": 8,
    "n_audio_head": 2,
    "n_audio_layer": 1,
    "n_vocab": 51864,
    "n_text_ctx": 8,
    "n_text_state": 8,
    "n_text_head": 2,
    "n_text_layer": 1,
}


def tiny_mlx_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Tensors named and laid out as an mlx-whisper directory stores them (conv [out, k, in])."""
    a, t = DIMS["n_audio_state"], DIMS["n_text_state"]
    w = {
        "encoder.conv1.weight": (a, 3, DIMS["n_mels"]),
        "encoder.conv1.bias": (a,),
        "encoder.conv2.weight": (a, 3, a),
        "encoder.conv2.bias": (a,),
        "encoder.ln_post.weight": (a,),
        "encoder.ln_post.bias": (a,),
        "decoder.token_embedding.weight": (DIMS["n_vocab"], t),
        "decoder.positional_embedding": (DIMS["n_text_ctx"], t),
        "decoder.ln.weight": (t,),
        "decoder.ln.bias": (t,),
    }
    for side, n, attns in (("encoder", a, ("attn",)), ("decoder", t, ("attn", "cross_attn"))):
        prefix = f"{side}.blocks.0"
        for attn in attns:
            for proj in ("query", "key", "value", "out"):
                w[f"{prefix}.{attn}.{proj}.weight"] = (n, n)
                if proj != "key":
                    w[f"{prefix}.{attn}.{proj}.bias"] = (n,)
            w[f"{prefix}.{attn}_ln.weight"] = w[f"{prefix}.{attn}_ln.bias"] = (n,)
        w[f"{prefix}.mlp1.weight"], w[f"{prefix}.mlp1.bias"] = (4 * n, n), (4 * n,)
        w[f"{prefix}.mlp2.weight"], w[f"{prefix}.mlp2.bias"] = (n, 4 * n), (n,)
        w[f"{prefix}.mlp_ln.weight"] = w[f"{prefix}.mlp_ln.bias"] = (n,)
    tensors = {k: rng.standard_normal(shape).astype(np.float32) for k, shape in w.items()}
    tensors["alignment_heads"] = np.array([[0, 1]], dtype=np.int64)
    return tensors


def test_safetensors_reader_round_trips(tmp_path):
    tensors = tiny_mlx_weights(np.random.default_rng(0))
    write_safetensors(tmp_path / "w.safetensors", tensors)
    back = gen.read_safetensors(tmp_path / "w.safetensors")
    assert set(back) == set(tensors)
    assert all(back[k].dtype == tensors[k].dtype and np.array_equal(back[k], tensors[k]) for k in tensors)


MAPPING_PROBE = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import generate
model = generate.load_openai_model(sys.argv[2])
state = model.state_dict()
print(json.dumps({
    "conv1": state["encoder.conv1.weight"].numpy().tolist(),
    "mlp0": state["decoder.blocks.0.mlp.0.weight"].numpy().tolist(),
    "heads": model.alignment_heads.to_dense().tolist(),
}))
"""


def run_probe(model_dir: Path) -> subprocess.CompletedProcess:
    from harness.oracle.venvs import ensure_oracle_env

    env = ensure_oracle_env("openai-whisper")
    cmd, environ = env.command("-c", MAPPING_PROBE, str(GENERATOR.parent), str(model_dir))
    return subprocess.run(cmd, env=environ, capture_output=True, text=True, check=False)


@pytest.fixture
def tiny_model(tmp_path) -> tuple[Path, dict[str, np.ndarray]]:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(DIMS | {"model_type": "whisper"}))
    tensors = tiny_mlx_weights(np.random.default_rng(1))
    write_safetensors(model / "weights.safetensors", tensors)
    return model, tensors


@pytest.mark.slow
@pytest.mark.xdist_group("openai-whisper-venv")
def test_weights_map_onto_openai_whisper_and_the_mapping_is_strict(tiny_model):
    model_dir, tensors = tiny_model
    out = run_probe(model_dir)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert np.array_equal(np.array(got["conv1"], np.float32), tensors["encoder.conv1.weight"].transpose(0, 2, 1))
    assert np.array_equal(np.array(got["mlp0"], np.float32), tensors["decoder.blocks.0.mlp1.weight"])
    assert got["heads"] == [[False, True]]

    # one tensor missing, one unknown, one of the wrong shape: each named
    del tensors["decoder.ln.bias"]
    tensors["decoder.extra.weight"] = np.zeros(3, np.float32)
    tensors["encoder.ln_post.weight"] = np.zeros(7, np.float32)
    write_safetensors(model_dir / "weights.safetensors", tensors)
    out = run_probe(model_dir)
    assert out.returncode != 0
    assert "WeightsError" in out.stderr
    assert "decoder.extra.weight: no openai-whisper state_dict entry" in out.stderr
    assert "encoder.ln_post.weight: shape (7,), encoder.ln_post.weight expects (8,)" in out.stderr
    assert "state_dict entries without a weight: ['decoder.ln.bias'" in out.stderr
