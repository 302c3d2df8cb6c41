"""additional_special_tokens alone is gated (issue 53: branch coverage showed no gated tokenizer
had `additional_special_tokens` without `extra_special_tokens`, nor an {"__type": "AddedToken"}
object in a token list; the first parity run of llama-additional-tokens-mini found the in-tree
tokenizer crashing on that object, "'dict' object has no attribute 'special'", where transformers
converts every such object of the config).

llama-additional-tokens-mini (harness/artifacts/twins/llama_legacy.py) passes `make parity` with
every check run; the ChatML markers are one id each past the trained vocabulary, and the pad
token tokenizer.json added as a plain token is special (named pad_token), so a decode that skips
special tokens drops it."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.profile.load import find_profile
from tests.conftest import parity_passes_every_check

MODEL = "llama-additional-tokens-mini"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(MODEL)]


def _tokenizer():
    from harness.artifacts.resolve import resolve_artifact
    from models.universal.tokenizer import ChatTokenizer

    return ChatTokenizer.from_dir(resolve_artifact(find_profile(MODEL)).model_dir)


def test_the_additional_tokens_are_one_id_each_and_pad_is_special() -> None:
    tokenizer = _tokenizer()
    assert tokenizer.encode("<|im_start|><|im_end|><pad>") == [1, 2049, 2050, 2048]
    assert tokenizer.decode(tokenizer.encode("a<pad>b"), skip_special_tokens=True) == "ab"


def test_make_parity_passes_with_every_check_run(tmp_path: Path) -> None:
    parity_passes_every_check(MODEL, tmp_path)
