"""Multi-head attention is gated (issue 53: branch coverage showed every gated model grouped its
query heads, so the universal Llama's quantized attention without grouping, and the fused SDPA
composition's fallback on float32, were walked by no gate).

llama-mha-mini (harness/artifacts/twins/llama_templates.py: 2 query heads, 2 KV heads) passes
`make parity` with every check run: mlx-lm's quantized KV (8 bits from the first prefill chunk,
4 bits converted mid-decode) and mlx-optiq's fused SDPA composition, bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.profile.load import find_profile
from tests.conftest import parity_passes_every_check

MODEL = "llama-mha-mini"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(MODEL)]


def test_the_twin_does_not_group_its_query_heads() -> None:
    from harness.artifacts.resolve import resolve_artifact
    from models.universal.config import read_config_json

    config = read_config_json(resolve_artifact(find_profile(MODEL)).model_dir)
    assert config["num_attention_heads"] == config["num_key_value_heads"] == 2


def test_make_parity_passes_with_every_check_run(tmp_path: Path) -> None:
    parity_passes_every_check(MODEL, tmp_path)
