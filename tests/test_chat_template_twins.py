"""Named chat templates are gated (issue 53: branch coverage showed every gated tokenizer kept one
template, so how the in-tree tokenizer finds named ones and picks `tool_use` for a request with
tools was walked by no gate; the first parity run of llama-chat-templates-mini found that it
looked for them in `chat_templates/` where transformers 5 reads `additional_chat_templates/`).

The two template twins (harness/artifacts/twins/llama_templates.py) pass `make parity` with every
check run, and each template fault of harness/tools/mutant_faults_tokens.py is killed on its
twin's `tools` scenario by prompt_identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.profile.load import find_profile
from harness.tools.mutant_faults_tokens import TOKEN_MUTANTS
from tests.conftest import parity_passes_every_check

MODELS = ("llama-chat-templates-mini", "llama-chat-template-list-mini")
TEMPLATE_MUTANTS = [m for m in TOKEN_MUTANTS if m.model in MODELS]
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("llama-chat-templates")]


@pytest.mark.parametrize("model", MODELS)
def test_make_parity_passes_with_every_check_run(model: str, tmp_path: Path) -> None:
    parity_passes_every_check(model, tmp_path)


@pytest.mark.parametrize("model", MODELS)
def test_tools_pick_the_named_template_and_plain_chat_the_default(model: str) -> None:
    from harness.artifacts.resolve import resolve_artifact
    from models.universal.tokenizer import ChatTokenizer

    tokenizer = ChatTokenizer.from_dir(resolve_artifact(find_profile(model)).model_dir)
    assert sorted(tokenizer.chat_templates) == ["default", "tool_use"]
    assert "[AVAILABLE_TOOLS]" in tokenizer.chat_template(tools=[{"type": "function"}])
    assert "[AVAILABLE_TOOLS]" not in tokenizer.chat_template()
    assert tokenizer.chat_template("tool_use") == tokenizer.chat_templates["tool_use"]


def test_each_template_fault_has_its_twin() -> None:
    assert {m.model for m in TEMPLATE_MUTANTS} == set(MODELS)


@pytest.mark.parametrize("mutant", TEMPLATE_MUTANTS, ids=lambda m: m.name)
def test_each_template_fault_is_killed_by_prompt_identity(mutant) -> None:
    from harness.tools.mutants import judge

    judged = judge(mutant)
    assert judged["killed"], judged["summaries"]
    assert judged["outcomes"]["prompt_identity"] in ("failed", "error"), judged["summaries"]
