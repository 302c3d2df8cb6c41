"""What a tokenizer directory's files other than tokenizer.json say: its JSON files read (an
unreadable one is a TokenizerError), the chat templates by name, and mlx-lm's eos token ids
(config.json / generation_config.json plus the tokenizer's own EOS).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from models.universal.config import read_config_json
from models.universal.errors import ConfigError, TokenizerError


def _read_json(path: Path) -> Any:
    if not path.exists():
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{path} is not valid JSON ({e})") from e


def _read_model_config(path: Path) -> dict[str, Any]:
    try:
        return read_config_json(path)
    except ConfigError:
        return {}


def _chat_templates(path: Path, from_config: Any) -> dict[str, str]:
    """Templates by name; chat_template.jinja and additional_chat_templates/*.jinja (transformers
    5's folder for named templates) win over the config."""
    from_files: dict[str, str] = {}
    if (path / "chat_template.jinja").exists():
        from_files["default"] = (path / "chat_template.jinja").read_text(encoding="utf-8")
    template_dir = path / "additional_chat_templates"
    if template_dir.is_dir():
        for file in sorted(template_dir.glob("*.jinja")):
            from_files[file.stem] = file.read_text(encoding="utf-8")
    if from_files:
        return from_files
    if from_config is None:
        return {}
    if isinstance(from_config, str):
        return {"default": from_config}
    if isinstance(from_config, list):
        return {t["name"]: t["template"] for t in from_config}
    raise TokenizerError(f"tokenizer_config.chat_template: unexpected {type(from_config).__name__}")


def _eos_token_ids(path: Path, backend: Tokenizer, eos_token: str | None, unk_token: str | None) -> frozenset[int]:
    """mlx-lm's rule: generation_config.json's eos_token_id (when truthy) replaces
    config.json's; the tokenizer's own EOS id is added to them."""
    config_eos = _read_model_config(path).get("eos_token_id")
    try:
        generation = _read_json(path / "generation_config.json")
    except TokenizerError:
        generation = None  # mlx-lm ignores an unreadable generation_config.json
    if isinstance(generation, dict) and generation.get("eos_token_id"):
        config_eos = generation["eos_token_id"]
    ids = set([config_eos] if isinstance(config_eos, int) else (config_eos or []))
    if eos_token is not None:
        # transformers maps a token missing from the vocab to the unk id.
        eos_id = backend.token_to_id(eos_token)
        if eos_id is None and unk_token is not None:
            eos_id = backend.token_to_id(unk_token)
        if eos_id is not None:
            ids.add(eos_id)
    return frozenset(ids)
