"""The added and special tokens of a tokenizer directory, as transformers collects them and
re-registers them on the backend it built.

They come from tokenizer_config.json's `added_tokens_decoder` and named tokens (or the legacy
special_tokens_map.json and tokenizer.json's added tokens), with the defaults a rebuilding
class assumes when the config names none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer

from models.universal.errors import TokenizerError
from models.universal.tokenizer_files import _read_json

# transformers' named special tokens, in its order (the order tokens get registered).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# Special tokens a rebuilding class assumes when tokenizer_config.json names none.
_CLASS_DEFAULT_TOKENS = {
    "gpt2": {"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
    "llama": {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
    "file": {},
}


def _to_added_token(value: Any) -> Any:
    """tokenizer_config's {"__type": "AddedToken", ...} objects -> AddedToken."""
    if isinstance(value, dict) and value.get("__type") == "AddedToken":
        fields = {k: v for k, v in value.items() if k != "__type"}
        return AddedToken(**fields)
    if isinstance(value, list):
        return [_to_added_token(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_added_token(v) for k, v in value.items()}
    return value


def _added_tokens_decoder(
    path: Path, settings: dict[str, Any], tokenizer_json: dict[str, Any]
) -> dict[int, AddedToken]:
    """The added tokens transformers re-registers, by id (settings updated in place)."""
    decoder: dict[int, AddedToken] = {}
    if "added_tokens_decoder" in settings:
        for index, token in settings.pop("added_tokens_decoder").items():
            if not isinstance(token, dict):
                raise TokenizerError(f"added_tokens_decoder[{index}]: expected an object")
            fields = {k: v for k, v in token.items() if k != "__type"}
            decoder[int(index)] = AddedToken(**fields)
        return decoder
    # Legacy layout: special_tokens_map.json and tokenizer.json's added tokens.
    legacy_map = _read_json(path / "special_tokens_map.json") or {}
    for key, value in legacy_map.items():
        if isinstance(value, dict) and key != "extra_special_tokens":
            fields = {k: v for k, v in value.items() if k != "special"}
            value = AddedToken(**fields, special=True)
        elif key == "extra_special_tokens" and isinstance(value, list):
            existing = list(settings.get("extra_special_tokens") or [])
            for token in value:
                token = AddedToken(**token, special=True) if isinstance(token, dict) else token
                if token not in existing:
                    existing.append(token)
            value = existing
        settings[key] = value
    for token in tokenizer_json.get("added_tokens", []):
        fields = {k: v for k, v in token.items() if k != "id"}
        decoder[token["id"]] = AddedToken(**fields)
    return decoder


def _special_tokens(settings: dict[str, Any], added_tokens: dict[int, AddedToken], kind: str) -> dict[str, Any]:
    """Named, model-specific (`image_token`, ...) and extra special tokens, as transformers
    collects them; values are str or AddedToken (settings updated in place)."""
    for key in ("additional_special_tokens", "extra_special_tokens"):
        if key in settings:  # transformers converts every {"__type": "AddedToken"} of the config
            settings[key] = _to_added_token(settings[key])
    if "additional_special_tokens" in settings and not settings.get("extra_special_tokens"):
        settings["extra_special_tokens"] = settings.pop("additional_special_tokens")
    model_specific = {
        key: settings.pop(key)
        for key in list(settings)
        if key not in SPECIAL_TOKEN_NAMES and key.endswith("_token") and isinstance(settings[key], str)
    }
    extra = settings.pop("extra_special_tokens", None) or []
    if isinstance(extra, dict):
        model_specific.update(extra)
        extra = []
    by_content = {str(token): token for token in added_tokens.values()}
    named: dict[str, Any] = {}
    for name in SPECIAL_TOKEN_NAMES:
        if name in settings:
            value = _to_added_token(settings.pop(name))
            if value is not None and by_content:
                value = by_content.get(str(value), value)
            named[name] = value
    for name, value in _CLASS_DEFAULT_TOKENS[kind].items():
        named.setdefault(name, value)
    for name, value in named.items():
        if value is not None and not isinstance(value, (str, AddedToken)):
            raise TokenizerError(f"tokenizer_config.{name}: expected a string, got {value!r}")
    return {"named": named, "model_specific": model_specific, "extra": list(extra)}


def _register_tokens(backend: Tokenizer, added_tokens: dict[int, AddedToken], special: dict[str, Any]) -> None:
    """Re-add the added and special tokens as transformers does after building."""
    to_add: list[Any] = [added_tokens[i] for i in sorted(added_tokens)]
    present = backend.get_added_tokens_decoder()
    known = [present[i].content for i in sorted(present)] + [str(t) for t in to_add]
    for value in [*special["named"].values(), *special["model_specific"].values()]:
        if value is not None and str(value) not in known and value not in to_add:
            to_add.append(value)
    for value in special["extra"]:
        if str(value) not in known and value not in to_add:
            to_add.append(value)
    named_contents = {str(v) for v in [*special["named"].values(), *special["model_specific"].values()] if v}
    tokens = []
    for token in to_add:
        if isinstance(token, str):
            token = AddedToken(token, special=True)
        elif not token.special and str(token) in named_contents:
            token.special = True
        tokens.append(token)
    if tokens:
        backend.add_tokens(tokens)
