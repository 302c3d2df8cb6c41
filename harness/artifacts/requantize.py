"""A draft model made of the target's own weights, requantized (a scenario's
`draft: {requantize: {bits, group_size}}`, harness/profile/draft.py).

Every affine-quantized module of the target's model directory is dequantized (mx.dequantize at
its own bits / group size, in the dtype of its scales) and quantized again with mx.quantize at
the recipe's bits and group size; every other tensor is kept bit for bit, the tokenizer and
generation files are copied and config.json's `quantization` says the new setting. The result is
built once into the cache (on the CPU stream: its bytes must not depend on the machine), keyed by
the recipe, its settings and the sha256 of the source's files, and checked against the record
of its files on every use like any directory made here (harness/artifacts/files.py).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from harness.artifacts.files import build_once, building_dir, file_hashes
from harness.errors import ArtifactError
from harness.paths import cache_root
from harness.progress import progress

_REPLACED = ("config.json", "model.safetensors.index.json")


def _source(draft: dict[str, Any], where: str) -> tuple[Path, dict[str, Any], dict[str, str]]:
    """The target's model directory, identity and file hashes (integrity-checked)."""
    from harness.artifacts import resolve
    from harness.profile import ArtifactSpec

    spec = ArtifactSpec(**draft["source_artifact"])
    resolvers = {"hub": resolve._resolve_hub, "pypi-gguf": resolve._resolve_pypi_gguf}
    if spec.source not in resolvers:
        raise ArtifactError(f"{where}.requantize: the target is not a language model (source {spec.source!r})")
    model_dir, identity = resolvers[spec.source](spec)
    if spec.source == "hub" and "twin" not in identity:
        hashes = resolve.verify_hub_snapshot(model_dir, spec)
    else:
        hashes = file_hashes(model_dir)
    return model_dir, identity, hashes


def _setting(quantization: dict[str, Any], module: str, where: str) -> tuple[int, int]:
    """(group_size, bits) of one quantized module: its own entry, else the model-wide one."""
    own = quantization.get(module)
    setting = own if isinstance(own, dict) else quantization
    if setting.get("mode", "affine") != "affine" or "bits" not in setting or "group_size" not in setting:
        raise ArtifactError(f"{where}.requantize: {module} is not affine-quantized with bits and group_size: {setting}")
    return int(setting["group_size"]), int(setting["bits"])


def requantize_dir(source: Path, out: Path, bits: int, group_size: int, where: str) -> None:
    """Write the requantized model directory for the model at `source` into `out`."""
    import mlx.core as mx

    config = json.loads((source / "config.json").read_text())
    quantization = config.get("quantization") or config.get("quantization_config")
    if not isinstance(quantization, dict):
        raise ArtifactError(f"{where}.requantize: the target {source} has no quantized weights to requantize")
    weights: dict[str, Any] = {}
    for path in sorted(source.glob("*.safetensors")):
        weights.update(mx.load(str(path)))
    modules = sorted(name.removesuffix(".scales") for name in weights if name.endswith(".scales"))
    if not modules:
        raise ArtifactError(f"{where}.requantize: the target {source} holds no quantized module (no *.scales)")
    for module in modules:
        old_group, old_bits = _setting(quantization, module, where)
        if f"{module}.biases" not in weights:
            raise ArtifactError(f"{where}.requantize: {module} has scales but no biases (not affine)")
        full = mx.dequantize(
            weights[f"{module}.weight"],
            weights[f"{module}.scales"],
            weights[f"{module}.biases"],
            group_size=old_group,
            bits=old_bits,
        )
        if full.shape[-1] % group_size:
            raise ArtifactError(
                f"{where}.requantize.group_size: {group_size} does not divide {module}'s input width {full.shape[-1]}"
            )
        packed, scales, biases = mx.quantize(full, group_size=group_size, bits=bits)
        weights |= {f"{module}.weight": packed, f"{module}.scales": scales, f"{module}.biases": biases}
    mx.eval(weights)
    mx.save_safetensors(str(out / "model.safetensors"), dict(sorted(weights.items())), metadata={"format": "mlx"})
    setting = {"group_size": group_size, "bits": bits}
    for key in ("quantization", "quantization_config"):
        if key in config:
            config[key] = setting
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for path in sorted(source.iterdir()):
        if path.is_file() and not path.name.startswith(".") and not path.name.endswith(".safetensors"):
            if path.name not in _REPLACED:
                shutil.copyfile(path, out / path.name)  # follows an HF snapshot's symlink


def requantized_draft(draft: dict[str, Any], where: str) -> tuple[Path, dict[str, Any]]:
    """The requantized draft's directory (built once) and identity."""
    source, source_identity, source_hashes = _source(draft, where)
    recipe = draft["requantize"]
    bits, group_size = int(recipe["bits"]), int(recipe["group_size"])
    identity = {
        "source": "requantized",
        "recipe": draft["recipe"],
        "bits": bits,
        "group_size": group_size,
        "of": source_identity,
        "of_files_sha256": hashlib.sha256(json.dumps(source_hashes, sort_keys=True).encode()).hexdigest(),
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    key = f"requantized-{bits}b-g{group_size}-{digest[:16]}"
    target = cache_root() / "artifacts" / key

    def build() -> None:
        import mlx.core as mx

        with progress.task(f"requantizing {source.name} to {bits} bits, group size {group_size} (draft)"):
            with building_dir(target, json.dumps(identity, sort_keys=True)) as tmp, mx.stream(mx.cpu):
                requantize_dir(source, tmp, bits, group_size, where)

    build_once(target, target, f"requantized draft {key}", f"artifact-{key}", build)
    return target, identity


def requantized_provenance(spec: dict[str, Any]) -> dict[str, Any] | None:
    """What a golden of a `requantize` draft scenario depends on beyond its spec: the draft's
    identity and the sha256 of its weights as built here (None for any other scenario)."""
    draft = spec.get("draft")
    if not draft or "requantize" not in draft:
        return None
    model_dir, identity = requantized_draft(draft, f"{spec['id']}.draft")
    hashes = file_hashes(model_dir)
    return {"identity": identity, "weights": {n: h for n, h in hashes.items() if n.endswith(".safetensors")}}
