"""Special-token faults of `make mutants` (issue 53): slips in how the universal Llama collects
special tokens from a legacy tokenizer layout (models/universal/special_tokens.py), killed on
llama-legacy-tokens-mini (harness/artifacts/twins/llama_legacy.py), the only gated tokenizer
without `added_tokens_decoder`; and slips in how it finds and picks a named chat template, killed
on the two template twins, and the GPT-2 class rebuild ignored, killed on its twin (harness/
artifacts/twins/llama_templates.py)."""

from __future__ import annotations

import contextlib
from typing import Any

from harness.tools.mutant_faults import Mutant, _setattr


def legacy_extra_tokens_dropped() -> contextlib.AbstractContextManager[None]:
    """The extra special tokens of a legacy special_tokens_map.json read but never registered:
    `<|tool|>` stays text, split into pieces, where transformers makes it one id."""
    import models.universal.tokenizer as tokenizer  # imports _register_tokens by name

    register = tokenizer._register_tokens

    def without_extra(backend: Any, added_tokens: Any, special: dict[str, Any]) -> None:
        register(backend, added_tokens, {**special, "extra": []})  # the fault

    return _setattr(tokenizer, "_register_tokens", without_extra)


def additional_over_extra() -> contextlib.AbstractContextManager[None]:
    """transformers 4's precedence: `additional_special_tokens` registered even where
    `extra_special_tokens` is present (transformers 5, the oracle's, drops it then): the ChatML
    markers become one id each where the oracle splits them into pieces."""
    import models.universal.tokenizer as tokenizer

    special_tokens = tokenizer._special_tokens

    def both(settings: dict[str, Any], added_tokens: Any, kind: str) -> dict[str, Any]:
        additional = list(settings.pop("additional_special_tokens", None) or [])
        out = special_tokens(settings, added_tokens, kind)
        return {**out, "extra": [*out["extra"], *additional]}  # the fault

    return _setattr(tokenizer, "_special_tokens", both)


def template_folder_ignored() -> contextlib.AbstractContextManager[None]:
    """Named templates looked for in a folder transformers does not read (`chat_templates/`, the
    in-tree spelling until issue 53's template twin): with tools the default template is
    rendered where the oracle renders additional_chat_templates/tool_use.jinja."""
    import models.universal.tokenizer as tokenizer

    def default_only(path: Any, from_config: Any) -> dict[str, str]:
        jinja = path / "chat_template.jinja"
        if jinja.exists():
            return {"default": jinja.read_text(encoding="utf-8")}  # the fault: no named ones
        return {"default": from_config} if isinstance(from_config, str) else {}

    return _setattr(tokenizer, "_chat_templates", default_only)


def tool_use_template_ignored() -> contextlib.AbstractContextManager[None]:
    """The default template rendered whether or not the request has tools (transformers picks
    a template named `tool_use` when it does)."""
    import models.universal.tokenizer as tokenizer

    chat_template = tokenizer.ChatTokenizer.chat_template

    def without_tools(self: Any, name: str | None = None, tools: Any = None) -> str:
        return chat_template(self, name, None)  # the fault

    return _setattr(tokenizer.ChatTokenizer, "chat_template", without_tools)


def gpt2_class_as_file() -> contextlib.AbstractContextManager[None]:
    """tokenizer_class GPT2Tokenizer ignored: tokenizer.json used as written where transformers
    rebuilds the BPE with GPT-2's pre-tokenizer (and the config's prefix space)."""
    import models.universal.tokenizer as tokenizer

    backend_kind = tokenizer._backend_kind

    def as_file(settings: dict[str, Any], model_config: dict[str, Any], tokenizer_json: str) -> str:
        kind = backend_kind(settings, model_config, tokenizer_json)
        return "file" if kind == "gpt2" else kind  # the fault

    return _setattr(tokenizer, "_backend_kind", as_file)


TOKEN_MUTANTS = [
    Mutant("legacy-extra-dropped", "a legacy map's extra special tokens never registered",
           "llama-legacy-tokens-mini", "markers-in-text", patch=legacy_extra_tokens_dropped),
    Mutant("additional-over-extra", "additional_special_tokens registered beside extra_special_tokens",
           "llama-legacy-tokens-mini", "markers-in-text", patch=additional_over_extra),
    Mutant("template-folder-ignored", "named templates looked for in chat_templates/, not additional_chat_templates/",
           "llama-chat-templates-mini", "tools", patch=template_folder_ignored),
    Mutant("tool-use-template-ignored", "the default template rendered for a request with tools",
           "llama-chat-template-list-mini", "tools", patch=tool_use_template_ignored),
    Mutant("gpt2-class-as-file", "tokenizer_class GPT2Tokenizer ignored (tokenizer.json used as written)",
           "minicpm5-gpt2-class-mini", "plain", patch=gpt2_class_as_file),
]  # fmt: skip
