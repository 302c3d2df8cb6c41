"""transformers' GPT2Tokenizer rebuild is gated (issue 53: branch coverage showed every gated
byte-level tokenizer was loaded as written, so models/universal/tokenizer_classes.py's GPT-2
rebuild, and the GPT-2 class's default special tokens, were walked by no gate).

minicpm5-gpt2-class-mini (harness/artifacts/twins/llama_templates.py) passes `make parity` with
every check run; its rebuilt pre-tokenizer adds the configured prefix space that tokenizer.json's
lacks; the fault "tokenizer_class ignored" is killed by prompt_identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.profile.load import find_profile
from harness.tools.mutant_faults_tokens import TOKEN_MUTANTS
from tests.conftest import parity_passes_every_check

MODEL = "minicpm5-gpt2-class-mini"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(MODEL)]


def test_the_rebuild_adds_the_prefix_space_tokenizer_json_lacks() -> None:
    from harness.artifacts.resolve import resolve_artifact
    from models.universal.tokenizer import ChatTokenizer

    rebuilt = ChatTokenizer.from_dir(resolve_artifact(find_profile(MODEL)).model_dir)
    as_written = ChatTokenizer.from_dir(resolve_artifact(find_profile("minicpm5-2b-mini")).model_dir)
    text = "It's 2026"
    assert rebuilt.encode(text)[1:] == as_written.encode(text)
    assert rebuilt.backend.id_to_token(rebuilt.encode(text)[0]) == "\u0120"  # GPT-2's "Ġ": a space


def test_make_parity_passes_with_every_check_run(tmp_path: Path) -> None:
    parity_passes_every_check(MODEL, tmp_path)


@pytest.mark.parametrize("mutant", [m for m in TOKEN_MUTANTS if m.model == MODEL], ids=lambda m: m.name)
def test_the_class_ignored_is_killed_by_prompt_identity(mutant) -> None:
    from harness.tools.mutants import judge

    judged = judge(mutant)
    assert judged["killed"], judged["summaries"]
    assert judged["outcomes"]["prompt_identity"] in ("failed", "error"), judged["summaries"]
