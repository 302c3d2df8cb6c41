"""A Whisper candidate: MLX's own quantization of a control model directory's weights.

Made the way the public MLX conversions (mlx-community/whisper-*-4bit / -8bit) are made by
mlx-examples' whisper/convert.py `-q`: the model is built, `nn.quantize(model, group_size,
bits)` quantizes every module that has `to_quantized` (each `nn.Linear` and the decoder's
`nn.Embedding`, which the decoder also uses as its output projection; the convolutions, layer
norms and positional embedding stay as they are), and config.json gains `quantization:
{group_size, bits}`, which mlx-whisper's `load_models` reads back.

The public conversions quantize float16 weights. Our controls hold float32 weights whose values
came from float16 checkpoints (the CTranslate2 conversions), so when every weight to be
quantized is exactly a float16 value it is quantized as float16 (the same packed integers,
scales and biases as a float16 conversion's), and the scales and biases are stored in the
control's float32 (an exact widening), so the candidate computes in float32 as the control does.
Weights that are not float16 values (a seeded twin) are quantized in their own dtype. Every
other tensor is kept bit for bit; the other files of the directory are copied.

The candidate is built once into the cache (on the CPU stream: its bytes must not depend on the
machine), keyed by the recipe and the sha256 of the control's files, and checked against the
record of its files on every use (harness/artifacts/files.py).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from harness.artifacts.files import FILES_RECORD, _hash_with_index, _listed_files, build_once, building_dir, file_hashes
from harness.errors import ArtifactError
from harness.paths import cache_root
from harness.progress import progress

BUILDER = "whisper-mlx-quantize-1"  # bump when what is written changes: a new key, a new directory
_WEIGHT_FILES = ("weights.safetensors", "weights.npz")
_SUPPORTED_BITS = (2, 3, 4, 5, 6, 8)


def _control_hashes(control_dir: Path) -> dict[str, str]:
    """sha256 of every file of the control: checked against its record when it was made here."""
    if (control_dir / FILES_RECORD).is_file():
        return file_hashes(control_dir)
    hashes = _hash_with_index(control_dir, _listed_files(control_dir))
    return {name: h for name, h in hashes.items() if h is not None}


def _weights_path(model_dir: Path) -> Path:
    for name in _WEIGHT_FILES:
        if (model_dir / name).is_file():
            return model_dir / name
    raise ArtifactError(f"whisper control {model_dir}: no {' or '.join(_WEIGHT_FILES)}")


def _quantize_dtype(weights: dict[str, Any], modules: list[str]) -> Any:
    """float16 when every weight to be quantized is exactly a float16 value, else their own dtype."""
    import mlx.core as mx

    dtypes = {weights[f"{m}.weight"].dtype for m in modules}
    if len(dtypes) != 1:
        raise ArtifactError(f"whisper control: the weights to quantize mix dtypes {sorted(map(str, dtypes))}")
    (dtype,) = dtypes
    if dtype == mx.float16:
        return dtype
    exact = all(
        mx.array_equal(weights[f"{m}.weight"].astype(mx.float16).astype(dtype), weights[f"{m}.weight"]).item()
        for m in modules
    )
    return mx.float16 if exact else dtype


def quantize_whisper_dir(control_dir: Path, out: Path, bits: int, group_size: int) -> dict[str, Any]:
    """Write the quantized copy of the Whisper in `control_dir` into `out`; return what was done
    ({modules, quantized_in})."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten, tree_unflatten

    from models.whisper.load import ALIGNMENT_HEADS, read_dimensions, read_quantization
    from models.whisper.model import Whisper

    if read_quantization(control_dir) is not None:
        raise ArtifactError(f"whisper control {control_dir} is already quantized: quantize its float weights")
    weights = dict(mx.load(str(_weights_path(control_dir))))
    model = Whisper(read_dimensions(control_dir))
    # nn.quantize's default predicate (convert.py passes none): every module with to_quantized.
    modules = sorted(
        path
        for path, module in tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)
        if hasattr(module, "to_quantized")
    )
    missing = [m for m in modules if f"{m}.weight" not in weights]
    if missing:
        raise ArtifactError(f"whisper control {control_dir}: no weight for {missing[:5]}")
    quantized_in = _quantize_dtype(weights, modules)
    floats = {n: w for n, w in weights.items() if n != ALIGNMENT_HEADS}
    model.update(
        tree_unflatten(
            [(n, w.astype(quantized_in) if n.rsplit(".", 1)[0] in modules else w) for n, w in floats.items()]
        )
    )
    try:
        nn.quantize(model, group_size=group_size, bits=bits)
    except ValueError as e:
        raise ArtifactError(
            f"whisper candidate: MLX cannot quantize {control_dir} at {bits} bits, group {group_size}: {e}"
        ) from None
    packed = dict(tree_flatten(model.parameters()))
    out_weights = dict(weights)
    for m in modules:
        dtype = weights[f"{m}.weight"].dtype  # scales and biases widened back to the control's dtype
        out_weights[f"{m}.weight"] = packed[f"{m}.weight"]
        out_weights[f"{m}.scales"] = packed[f"{m}.scales"].astype(dtype)
        out_weights[f"{m}.biases"] = packed[f"{m}.biases"].astype(dtype)
    mx.eval(out_weights)
    mx.save_safetensors(str(out / "weights.safetensors"), dict(sorted(out_weights.items())), metadata={"format": "mlx"})
    config = json.loads((control_dir / "config.json").read_text())
    config["quantization"] = {"group_size": group_size, "bits": bits}
    (out / "config.json").write_text(json.dumps(config, indent=4) + "\n")
    for path in sorted(control_dir.iterdir()):
        if path.is_file() and not path.name.startswith(".") and path.name not in ("config.json", *_WEIGHT_FILES):
            shutil.copyfile(path, out / path.name)  # the tokenizer files (follows a snapshot's symlink)
    return {"modules": modules, "quantized_in": str(quantized_in).removeprefix("mlx.core.")}


def build_whisper_candidate(control_dir: Path, *, bits: int, group_size: int = 64) -> Path:
    """The control's weights quantized by MLX at `bits` / `group_size` (affine), built once into
    the cache and reused while its files match their record."""
    control_dir = Path(control_dir)
    if bits not in _SUPPORTED_BITS or type(bits) is not int:
        raise ArtifactError(f"whisper candidate bits: expected one of {list(_SUPPORTED_BITS)}, got {bits!r}")
    if type(group_size) is not int or group_size not in (32, 64, 128):
        raise ArtifactError(f"whisper candidate group_size: expected 32, 64 or 128, got {group_size!r}")
    if not (control_dir / "config.json").is_file():
        raise ArtifactError(f"whisper control {control_dir}: no config.json (not a model directory)")
    identity = {
        "source": "whisper-quantized",
        "builder": BUILDER,
        "bits": bits,
        "group_size": group_size,
        "mode": "affine",
        "of": control_dir.name,
        "of_files_sha256": hashlib.sha256(
            json.dumps(_control_hashes(control_dir), sort_keys=True).encode()
        ).hexdigest(),
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    key = f"whisper-q{bits}-g{group_size}-{digest[:16]}"
    target = cache_root() / "artifacts" / key

    def build() -> None:
        import mlx.core as mx

        with progress.task(
            f"quantizing {control_dir.name} to {bits} bits, group size {group_size} (whisper candidate)"
        ):
            with building_dir(target, json.dumps(identity, sort_keys=True)) as tmp, mx.stream(mx.cpu):
                done = quantize_whisper_dir(control_dir, tmp, bits, group_size)
                (tmp / "quantized.json").write_text(json.dumps(identity | done, indent=1, sort_keys=True) + "\n")

    build_once(target, target, f"whisper candidate {key}", f"artifact-{key}", build)
    return target
