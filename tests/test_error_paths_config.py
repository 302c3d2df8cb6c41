"""config.json's type checks (models/universal/config.py `_check_types`): each key of the wrong
JSON type is refused naming the key, what was expected and what was found, before anything is
built from it; the error paths the gates' branch coverage credits to make test (docs/coverage.md)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from models.universal.config import LlamaConfig
from models.universal.errors import ConfigError
from tests.test_error_paths_universal import CONFIG


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("model_type", 7, "a string"),
        ("hidden_size", 64.0, "an integer"),
        ("num_hidden_layers", True, "an integer"),
        ("head_dim", "16", "an integer or null"),
        ("max_position_embeddings", 4096.5, "an integer or null"),
        ("rms_norm_eps", "1e-5", "a number"),
        ("rope_theta", False, "a number"),
        ("tie_word_embeddings", 1, "true or false"),
        ("rope_scaling", [2.0], "an object or null"),
        ("eos_token_id", "2", "an integer, a list of integers or null"),
        ("eos_token_id", [2, "3"], "an integer, a list of integers or null"),
    ],
    ids=lambda v: str(v)[:24],
)
def test_a_key_of_the_wrong_type_is_refused_naming_it(key: str, value: Any, expected: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"config.{key}: expected {expected}, got {value!r}")):
        LlamaConfig.from_dict({**CONFIG, key: value})


@pytest.mark.parametrize("value", [None, 2, [2, 3]], ids=["null", "int", "list"])
def test_every_accepted_eos_spelling_passes(value: Any) -> None:
    assert LlamaConfig.from_dict({**CONFIG, "eos_token_id": value}).eos_token_id == value
