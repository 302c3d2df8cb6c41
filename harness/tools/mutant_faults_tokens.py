"""Special-token faults of `make mutants` (issue 53): slips in how the universal Llama collects
special tokens from a legacy tokenizer layout (models/universal/special_tokens.py), killed on
llama-legacy-tokens-mini (harness/artifacts/twins/llama_legacy.py), the only gated tokenizer
without `added_tokens_decoder`."""

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


TOKEN_MUTANTS = [
    Mutant("legacy-extra-dropped", "a legacy map's extra special tokens never registered",
           "llama-legacy-tokens-mini", "markers-in-text", patch=legacy_extra_tokens_dropped),
    Mutant("additional-over-extra", "additional_special_tokens registered beside extra_special_tokens",
           "llama-legacy-tokens-mini", "markers-in-text", patch=additional_over_extra),
]  # fmt: skip
