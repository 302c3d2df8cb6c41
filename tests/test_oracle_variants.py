"""Oracle versions chosen per profile (issue 33 part 4): `oracle_variant` names other pins for
the profile's oracle, with their own venv and golden key; the one-mlx rule holds per comparison."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import harness.oracle.descriptor as descriptor_module
import harness.oracle.pins as pins_module
from harness.errors import OracleError, OracleVersionError, ProfileError
from harness.implementations import Plugin
from harness.oracle.descriptor import descriptor
from harness.oracle.pins import comparison_mlx, pins_hash, pins_path, project_mlx, read_pins
from harness.paths import REPO_ROOT, oracles_dir
from harness.profile.load import load_profile
from harness.provenance import golden_key

VARIANT = "mlx-lm@mlx-lm-0.32.2-mlx-0.32.2"
DEMO = REPO_ROOT / "profiles" / "external" / "smollm2-135m-mlx-0.32.2.yaml"


@pytest.fixture
def oracles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of oracles/ the test may add variants to."""
    root = tmp_path / "oracles"
    shutil.copytree(oracles_dir(), root, ignore=shutil.ignore_patterns("__pycache__"))
    for module in (descriptor_module, pins_module):
        monkeypatch.setattr(module, "oracles_dir", lambda: root)
    return root


def test_a_variant_is_its_oracle_s_row_with_its_own_pins_venv_and_golden_key() -> None:
    row, base = descriptor(VARIANT), descriptor("mlx-lm")
    assert (row.name, row.base, row.variant) == (VARIANT, "mlx-lm", "mlx-lm-0.32.2-mlx-0.32.2")
    assert row.folder == base.folder and row.scripts == base.scripts and row.family == "mlx"
    assert pins_path(VARIANT) == oracles_dir() / "mlx-lm" / "variants" / "mlx-lm-0.32.2-mlx-0.32.2.txt"
    assert "mlx==0.32.2" in read_pins(VARIANT) and pins_hash(read_pins(VARIANT)) != pins_hash(read_pins("mlx-lm"))
    # The key names the comparison's mlx: the variant's pinned one, the project's for the row itself.
    assert comparison_mlx(VARIANT) == "0.32.2" and comparison_mlx("mlx-lm") == project_mlx() != "0.32.2"
    assert dict(golden_key(VARIANT).parts)["mlx"] == "0.32.2"
    assert golden_key(VARIANT).name == golden_key("mlx-lm").name.replace(f"mlx{project_mlx()}", "mlx0.32.2")
    assert comparison_mlx("openai-whisper") is None  # an mlx-free oracle runs no mlx at all


def test_an_unknown_variant_or_one_of_the_composing_oracle_is_an_error(oracles: Path) -> None:
    with pytest.raises(OracleError, match=r"mlx-lm@nope: no pins for variant 'nope' at .*variants/nope\.txt"):
        descriptor("mlx-lm@nope")
    (oracles / "mlx-optiq" / "variants").mkdir()
    (oracles / "mlx-optiq" / "variants" / "x.txt").write_text("mlx==0.32.2\n")
    with pytest.raises(OracleError, match=r"mlx-optiq@x: mlx-optiq judges composed paths .* no variants"):
        descriptor("mlx-optiq@x")


def test_a_variant_pins_exactly_one_mlx(oracles: Path) -> None:
    (oracles / "mlx-lm" / "variants" / "loose.txt").write_text("mlx-lm==0.31.3\nmlx>=0.32\n")
    with pytest.raises(OracleVersionError, match=r"variants/loose\.txt installs \(not pinned exactly\).*exactly one"):
        comparison_mlx("mlx-lm@loose")
    with pytest.raises(OracleVersionError, match=r"exactly one"):
        pins_module.check_mlx_pin("mlx-lm@loose", read_pins("mlx-lm@loose"), project_mlx())
    pins_module.check_mlx_pin(VARIANT, read_pins(VARIANT), project_mlx())  # its own mlx, not the project's


def test_a_profile_with_an_oracle_variant_is_judged_by_it_and_tells_its_plugin_the_mlx() -> None:
    profile = load_profile(DEMO)
    assert {profile.oracle_of(s) for s in profile.scenarios} == {VARIANT}
    assert profile.under_test.plugin is not None and profile.under_test.plugin._comparison_mlx == "0.32.2"


def _intree_profile(root: Path, variant: str) -> Path:
    text = (REPO_ROOT / "profiles" / "smollm2-135m.yaml").read_text()
    assert "\noracle: mlx-lm\n" in text
    path = root / "profiles" / "smollm2-135m.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text.replace("\noracle: mlx-lm\n", f"\noracle: mlx-lm\noracle_variant: {variant}\n"))
    return path


def test_an_in_tree_implementation_takes_a_variant_only_on_the_project_s_mlx(oracles: Path, tmp_path: Path) -> None:
    with pytest.raises(
        ProfileError,
        match=r"oracle_variant: mlx-lm@mlx-lm-0\.32\.2-mlx-0\.32\.2 runs mlx 0\.32\.2, universal-llama the "
        r"project's mlx 0\.32\.4: bits are compared within one mlx version.*pin mlx==0\.32\.2",
    ):
        load_profile(_intree_profile(tmp_path, "mlx-lm-0.32.2-mlx-0.32.2"))
    same = oracles / "mlx-lm" / "variants" / "mlx-lm-0.31.3.txt"
    same.write_text(read_pins("mlx-lm").replace("mlx-lm==0.32.2", "mlx-lm==0.31.3"))
    profile = load_profile(_intree_profile(tmp_path, "mlx-lm-0.31.3"))  # the upgrade question, in tree
    assert {profile.oracle_of(s) for s in profile.scenarios if s.composition is None} == {"mlx-lm@mlx-lm-0.31.3"}
    with pytest.raises(ProfileError, match=r"oracle_variant: oracle mlx-lm@nope: no pins for variant 'nope'"):
        load_profile(_intree_profile(tmp_path, "nope"))


def test_the_plugin_s_venv_and_hello_must_have_the_variant_s_mlx(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.oracle import plugin as venv
    from harness.provenance import device_facts
    from harness.records_schema import RECORDS_VERSION
    from harness.runners.process import PROTOCOL, ProtocolError, check_hello

    monkeypatch.setenv("MLX_PARITY_CACHE", str(tmp_path / "cache"))
    requirements = ["-r examples/stdio-client/requirements.txt"]  # mlx 0.32.4, the project's
    with pytest.raises(
        OracleVersionError, match=r"install mlx 0\.32\.4, its oracle runs mlx 0\.32\.2.*nothing was built"
    ):
        venv.ensure_plugin_env("x", requirements, "0.32.2")
    assert not any((tmp_path / "cache").glob("venvs/plugin-*/"))
    plugin = Plugin(command=["x"], name="x", _comparison_mlx="0.32.2")
    hello = {"protocol": PROTOCOL, "records_version": RECORDS_VERSION, "produces": "llm", "name": "x", "version": "1"}
    device = f"Device({device_facts().backend}, 0)"
    with pytest.raises(ProtocolError, match=r"it runs mlx 0\.32\.4, its oracle mlx 0\.32\.2"):
        check_hello(hello | {"environment": {"mlx": "0.32.4", "device": device}}, plugin)
    check_hello(hello | {"environment": {"mlx": "0.32.2", "device": device}}, plugin)


def test_the_variant_s_tracked_goldens_were_made_by_its_pins_under_its_key() -> None:
    """What the demo profile's tracked goldens say of the interpreter that made them."""
    profile = load_profile(DEMO)
    folder = REPO_ROOT / "goldens" / profile.name / golden_key(VARIANT).name
    manifests = sorted(folder.glob("*.json"))
    assert [m.stem for m in manifests] == sorted(s.id for s in profile.scenarios), folder
    for path in manifests:
        manifest = json.loads(path.read_text())
        assert manifest["oracle"] == VARIANT and manifest["provenance"]["oracle"]["pins_hash"] == pins_hash(
            read_pins(VARIANT)
        )
        environment = manifest["oracle_environment"]
        assert (environment["mlx"], environment["mlx-lm"]) == ("0.32.2", "0.32.2"), path


@pytest.mark.parametrize("variant", ["../../../evilvariant", "a/b", ".hidden", "x\\\\y", "a b", "é", "x" * 101])
def test_m7_v5_a_variant_that_is_not_a_plain_name_is_refused_at_profile_load(
    oracles: Path, tmp_path: Path, variant: str
) -> None:
    """Hostile probe 2, M7 (V5) and L12 (V6): `oracle_variant: ../../../evilvariant` read pins
    from outside the repository (here a copy of the project's, beside oracles/) and built the
    oracle venv outside the cache; 'a/b' said "variants of mlx-lm: none". A variant is a plain
    name, refused at load naming the profile, the field and the allowed form."""
    (tmp_path / "evilvariant.txt").write_text(read_pins("mlx-lm"))
    (oracles / "mlx-lm" / "variants" / "a").mkdir()
    (oracles / "mlx-lm" / "variants" / "a" / "b.txt").write_text(read_pins("mlx-lm"))
    path = _intree_profile(tmp_path, json.dumps(variant))
    with pytest.raises(ProfileError) as refused:
        load_profile(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: oracle_variant: ")
    assert "not a plain name: expected letters, digits, '-', '_' and '.', not starting with '.'" in message
    assert "mlx-lm-0.32.2-mlx-0.32.2" in message  # the variants there are


def test_l12_v6_a_variant_with_a_slash_names_the_variants_that_exist(oracles: Path) -> None:
    """Hostile probe 2, L12 (V6): 'a/b' said "variants of mlx-lm: none" (it listed variants/a/);
    it is now not a plain name, and that error, like an unknown variant's, lists variants/."""
    (oracles / "mlx-lm" / "variants" / "a").mkdir()
    listed = r"\(variants of mlx-lm: \['mlx-lm-0\.32\.2-mlx-0\.32\.2'\]\)"
    with pytest.raises(OracleError, match=r"mlx-lm@a/b: variant 'a/b' is not a plain name: .*" + listed):
        descriptor("mlx-lm@a/b")
    with pytest.raises(OracleError, match=r"mlx-lm@nope: no pins for variant 'nope' .*" + listed):
        descriptor("mlx-lm@nope")


def test_m7_v5_an_oracle_venv_outside_the_cache_s_venvs_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hostile probe 2, M7 (V5), defence in depth: whatever names an oracle, its venv lies in
    <cache>/venvs/ or nothing is built."""
    from harness.oracle.venvs import venv_root

    monkeypatch.setenv("MLX_PARITY_CACHE", str(tmp_path / "cache"))
    assert venv_root("mlx-lm@x", "abc") == tmp_path / "cache" / "venvs" / "mlx-lm@x-abc"
    for name in ("mlx-lm@../../../evil", "../x", "/var/x"):
        with pytest.raises(OracleError, match=r"oracle venv .* lies outside .*cache/venvs"):
            venv_root(name, "abc")
    assert not (tmp_path / "cache" / "venvs").exists()
