"""Special tokens in the legacy layout are gated (issue 53: branch coverage showed every gated
tokenizer listed its tokens in tokenizer_config.json's `added_tokens_decoder`, so
models/universal/special_tokens.py's legacy paths shipped ungated).

llama-legacy-tokens-mini (harness/artifacts/twins/llama_legacy.py): `make parity` passes with
every check run; the in-tree tokenizer makes the extra special tokens one id each and leaves
`additional_special_tokens` text where `extra_special_tokens` is present (transformers 5, the
oracle's rule: the goldens' prompt ids are the proof); and each special-token fault of
harness/tools/mutant_faults_tokens.py is killed on markers-in-text."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.profile.load import find_profile
from harness.tools.mutant_faults_tokens import TOKEN_MUTANTS
from tests.conftest import parity_passes_every_check

MODEL = "llama-legacy-tokens-mini"
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(MODEL)]


def test_make_parity_passes_with_every_check_run(tmp_path: Path) -> None:
    parity_passes_every_check(MODEL, tmp_path)


def test_the_extra_tokens_are_one_id_each_and_the_additional_ones_stay_text() -> None:
    from harness.artifacts.resolve import resolve_artifact
    from harness.artifacts.twins.llama_legacy import IM_START, IMAGE, TOOL
    from models.universal.tokenizer import ChatTokenizer

    tokenizer = ChatTokenizer.from_dir(resolve_artifact(find_profile(MODEL)).model_dir)
    assert tokenizer.encode(f"{IMAGE}{TOOL}")[1:] == [2048, 2049]  # past the 2048 trained pieces
    assert len(tokenizer.encode(IM_START)) > 2  # split into pieces, as transformers 5 leaves it


@pytest.mark.parametrize("mutant", TOKEN_MUTANTS, ids=lambda m: m.name)
def test_each_special_token_fault_is_killed_by_prompt_identity(mutant) -> None:
    from harness.tools.mutants import judge

    judged = judge(mutant)
    assert judged["killed"], judged["summaries"]
    assert judged["outcomes"]["prompt_identity"] in ("failed", "error"), judged["summaries"]
