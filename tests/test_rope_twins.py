"""Every rope type of the universal Llama is gated (issue 53: branch coverage showed no profile
used any rope but the default, so models/universal/rope.py's linear, dynamic NTK, Llama 3, YaRN
and LongRoPE paths shipped ungated).

Five tiny Llama twins (harness/artifacts/twins/llama_rope.py) differ only in config.json's
rope_scaling; per twin: the rope module mlx-lm builds (asked inside the oracle venv) is the one
for that type, and so is the in-tree model's, `make parity` passes with every scenario's checks
run, and the rope fault of harness/tools/mutant_faults_rope.py made for it is killed while the
unmutated implementation passes there."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness.artifacts.twins import build_twin
from harness.profile.load import find_profile
from harness.tools.mutant_faults_rope import ROPE_MUTANTS
from tests.conftest import parity_passes_every_check

# model -> (mlx-lm's rope class, the in-tree one, its input scale is applied)
PICKS = {
    "llama-rope-linear-mini": ("RoPE", "RoPE", None),
    "llama-rope-dynamic-mini": ("DynamicNTKScalingRoPE", "DynamicNTKRoPE", None),
    "llama-rope-llama3-mini": ("Llama3RoPE", "FrequencyRoPE", False),
    "llama-rope-yarn-mini": ("YarnRoPE", "FrequencyRoPE", True),
    "llama-rope-longrope-mini": ("SuScaledRoPE", "FrequencyRoPE", True),
}

ORACLE_SNIPPET = """
import json, sys
from mlx_lm import load
model, _ = load(sys.argv[1])
rope = model.model.layers[0].self_attn.rope
print(json.dumps({"class": type(rope).__name__, "scale": getattr(rope, "scale", None)}))
"""


def _models() -> list:
    return [pytest.param(m, marks=[pytest.mark.slow, pytest.mark.xdist_group(m)], id=m) for m in PICKS]


def _model_dir(model: str) -> Path:
    from harness.artifacts.resolve import resolve_artifact

    return resolve_artifact(find_profile(model)).model_dir


@pytest.mark.parametrize("model", _models())
def test_the_oracle_and_the_in_tree_model_build_that_types_rope(model: str) -> None:
    from harness.oracle.venvs import ensure_oracle_env
    from models.universal import load_model

    oracle_class, intree_class, scaled = PICKS[model]
    model_dir = _model_dir(model)
    config = json.loads((model_dir / "config.json").read_text())
    kind = model.split("-")[2]
    assert (config["rope_scaling"].get("rope_type") or config["rope_scaling"].get("type")) == kind
    cmd, env = ensure_oracle_env("mlx-lm").command("-c", ORACLE_SNIPPET, str(model_dir))
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["class"] == oracle_class

    rope = load_model(model_dir)[0].layers[0].self_attn.rope
    assert type(rope).__name__ == intree_class
    if scaled is not None:  # yarn's mscale ratio and longrope's mscale are not 1: the input is scaled
        assert (rope.input_scale != 1.0) == scaled


@pytest.mark.parametrize("model", _models())
def test_make_parity_passes_with_every_check_run(model: str, tmp_path: Path) -> None:
    parity_passes_every_check(model, tmp_path)


@pytest.mark.parametrize(
    "mutant",
    [pytest.param(m, marks=[pytest.mark.slow, pytest.mark.xdist_group(m.model)], id=m.name) for m in ROPE_MUTANTS],
)
def test_each_rope_fault_is_killed_on_its_twin(mutant) -> None:
    from harness.tools.mutants import judge

    judged = judge(mutant)
    assert judged["killed"], judged["summaries"]
    assert judged["outcomes"]["decode_logits"] == "failed", judged["summaries"]


def test_the_rope_twins_share_llama_spm_minis_weights_and_differ_in_rope_scaling(tmp_path: Path) -> None:
    identities = {m: build_twin(m, tmp_path / m) for m in [*PICKS, "llama-spm-mini"]}
    weights = {i["files"]["model-00001-of-00001.safetensors"]["sha256"] for i in identities.values()}
    assert len(weights) == 1
    scalings = [json.loads((tmp_path / m / "config.json").read_text())["rope_scaling"] for m in identities]
    assert scalings[-1] is None and len({json.dumps(s, sort_keys=True) for s in scalings}) == len(scalings)
