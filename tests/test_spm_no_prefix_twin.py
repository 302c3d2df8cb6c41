"""transformers' LlamaTokenizer rebuild with its other settings is gated (issue 53: branch
coverage showed every gated LlamaTokenizer had the default dummy prefix and a BOS
post-processor, so models/universal/tokenizer_classes.py's add_prefix_space=false decoder and
tokenizer.py's post-processor-less path were walked by no gate).

llama-spm-no-prefix-mini (harness/artifacts/twins/llama_templates.py) passes `make parity` with
every check run; its in-tree tokenizer adds no BOS and no "▁" before the first word (the
oracle's prompt ids in the goldens agree, prompt_identity being among the checks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.profile.load import find_profile
from tests.conftest import parity_passes_every_check

MODEL = "llama-spm-no-prefix-mini"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(MODEL)]


def test_no_bos_and_no_dummy_prefix() -> None:
    from harness.artifacts.resolve import resolve_artifact
    from models.universal.tokenizer import ChatTokenizer

    tokenizer = ChatTokenizer.from_dir(resolve_artifact(find_profile(MODEL)).model_dir)
    pieces = [tokenizer.backend.id_to_token(i) for i in tokenizer.encode("And God")]
    assert pieces == ["A", "nd", "\u2581God"]
    assert tokenizer.decode(tokenizer.encode(" And God")) == " And God"  # no Strip in the decoder


def test_make_parity_passes_with_every_check_run(tmp_path: Path) -> None:
    parity_passes_every_check(MODEL, tmp_path)
