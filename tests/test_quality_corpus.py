"""The shipped corpus is what fixtures/corpus/README.md says it is, and long enough: at least
4,096 tokens of SmolLM2's tokenizer and of MiniCPM5's (the twin's, offline)."""

from __future__ import annotations

import hashlib
import re

import pytest

from harness.artifacts.resolve import resolve_artifact
from harness.paths import REPO_ROOT
from harness.profile.load import find_profile
from harness.quality.intree import encode_corpus

CORPUS = REPO_ROOT / "fixtures" / "corpus" / "kjv-genesis-1-12.txt"


def test_the_corpus_is_the_recorded_file() -> None:
    readme = (CORPUS.parent / "README.md").read_text()
    recorded = re.search(r"`kjv-genesis-1-12.txt`, sha256 `([0-9a-f]{64})`", readme).group(1)
    assert hashlib.sha256(CORPUS.read_bytes()).hexdigest() == recorded
    assert CORPUS.stat().st_size < 100_000


@pytest.mark.parametrize("model", ["smollm2-135m", "minicpm5-2b-mini"])
def test_the_corpus_is_at_least_4k_tokens(model: str) -> None:
    profile = find_profile(model)
    ids = encode_corpus(resolve_artifact(profile).model_dir, CORPUS.read_text(encoding="utf-8"))
    assert len(ids) >= 4096, f"{model}: {len(ids)} tokens"
    corpus = profile.quality.corpus
    windows = (len(ids) - corpus.context) // (corpus.stride or corpus.context) + 1
    assert windows >= 2  # the profile's windows fit, more than once
