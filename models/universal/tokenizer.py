"""ChatTokenizer: encode, decode and chat rendering identical to transformers 5.

transformers' AutoTokenizer does not always run tokenizer.json as written. For a Llama
model directory it picks a class from `tokenizer_class` (tokenizer_config.json), and
some classes rebuild the pipeline: GPT2Tokenizer keeps only the BPE vocab/merges and the
post-processor (its own ByteLevel pre-tokenizer replaces e.g. a Digits split), and a
non-ByteLevel LlamaTokenizer installs its own Metaspace pipeline. It also ignores
`add_bos_token`/`add_eos_token` when tokenizer.json exists (the post-processor decides),
and re-registers the added and special tokens. We replay those steps on a `tokenizers`
backend, so the ids match without importing transformers. Classes we have not replayed
are a TokenizerError rather than a silent guess.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE

from models.universal import chat_template
from models.universal.config import read_config_json
from models.universal.errors import ConfigError, TokenizerError

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
# tokenizer_class values (without "Fast") that load tokenizer.json unchanged.
_FILE_AS_IS_CLASSES = frozenset(
    {"PreTrainedTokenizer", "PreTrainedTokenizerFast", "TokenizersBackend", "BloomTokenizer"}
)
# Model types AutoTokenizer maps to the generic backend whatever tokenizer_class says
# (mistral: when mistral_common is not installed, as in the oracle venv).
_GENERIC_BACKEND_MODEL_TYPES = frozenset({"mistral", "iquestcoder"})
# mlx-lm's TokenizerWrapper (tokenizer_utils._infer_thinking, mlx-lm 0.32.2): single-token
# (start, end) pairs checked in this order, then two multi-token conventions.
THINK_TOKENS = (
    ("<think>", "</think>"),
    ("<longcat_think>", "</longcat_think>"),
    ("<|think:start|>", "<|think:end|>"),
)
_CHANNEL_THINK = ("<|channel>thought", "<channel|>")  # when "<|channel>" and "<channel|>" are tokens
_XTML_TOKENS = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")
_XTML_THINK = ("<|open|>think<|sep|>", "<|close|>think<|sep|>")
# Special tokens a rebuilding class assumes when tokenizer_config.json names none.
_CLASS_DEFAULT_TOKENS = {
    "gpt2": {"unk_token": "<|endoftext|>", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
    "llama": {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
    "file": {},
}


class ChatTokenizer:
    """Text <-> ids and chat rendering for one model directory."""

    def __init__(
        self,
        backend: Tokenizer,
        special_tokens: dict[str, str],
        chat_templates: dict[str, str],
        eos_token_ids: frozenset[int],
        clean_up_tokenization_spaces: bool = False,
        decoder: object = None,
    ):
        self.backend = backend
        # tokenizer.json's own decoder, which picks mlx-lm's streaming detokenizer (transformers
        # may rebuild the backend's, e.g. without its Strip step for add_prefix_space: false).
        self.decoder = decoder
        self.special_tokens_map = special_tokens
        self.chat_templates = chat_templates
        self._eos_token_ids = eos_token_ids
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces

    @classmethod
    def from_dir(cls, path: str | Path) -> ChatTokenizer:
        """Load tokenizer.json, tokenizer_config.json, chat templates and eos ids."""
        path = Path(path)
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.exists():
            raise TokenizerError(f"{tokenizer_file} not found (only tokenizer.json is supported)")
        tokenizer_json_text = tokenizer_file.read_text(encoding="utf-8")
        settings = _read_json(path / "tokenizer_config.json") or {}
        model_config = _read_model_config(path)

        kind = _backend_kind(settings, model_config, tokenizer_json_text)
        settings = dict(settings)
        settings.pop("tokenizer_class", None)
        # With a tokenizer.json, transformers 5 drops these and lets the post-processor
        # decide whether BOS/EOS are added.
        settings.pop("add_bos_token", None)
        settings.pop("add_eos_token", None)

        templates = _chat_templates(path, settings.pop("chat_template", None))
        tokenizer_json = json.loads(tokenizer_json_text)
        added_tokens = _added_tokens_decoder(path, settings, tokenizer_json)
        special = _special_tokens(settings, added_tokens, kind)
        if tokenizer_json.get("padding"):
            special["named"].setdefault("pad_token", tokenizer_json["padding"]["pad_token"])

        backend = _build_backend(kind, tokenizer_file, tokenizer_json, settings)
        _register_tokens(backend, added_tokens, special)
        backend.encode_special_tokens = bool(settings.get("split_special_tokens", False))
        if backend.post_processor is None:
            # transformers installs an empty template (no BOS/EOS) in that case.
            backend.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
        # transformers disables truncation and padding for a plain encode.
        backend.no_truncation()
        backend.no_padding()

        named = {
            name: str(value)
            for name, value in {**special["named"], **special["model_specific"]}.items()
            if value is not None
        }
        eos_ids = _eos_token_ids(path, backend, named.get("eos_token"), named.get("unk_token"))
        return cls(
            backend,
            named,
            templates,
            eos_ids,
            clean_up_tokenization_spaces=bool(settings.get("clean_up_tokenization_spaces", False)),
            decoder=tokenizer_json.get("decoder"),
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text = self.backend.decode(ids, skip_special_tokens=skip_special_tokens)
        # transformers skips this WordPiece-era cleanup for BPE models.
        if self.clean_up_tokenization_spaces and type(self.backend.model).__name__ != "BPE":
            text = _clean_up_tokenization(text)
        return text

    def token_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    @property
    def think_markers(self) -> tuple[str, str] | None:
        """The (start, end) thinking markers mlx-lm infers from the vocabulary, or None.

        mlx-lm's rule, in its order: the first of THINK_TOKENS whose start and end are both
        vocabulary entries (added tokens included); else "<|channel>thought"/"<channel|>"
        when "<|channel>" and "<channel|>" are entries; else, for an XTML vocabulary (all of
        <|open|>, <|close|>, <|sep|>, <|end_of_msg|>), "<|open|>think<|sep|>" and
        "<|close|>think<|sep|>". Only membership is checked, so no encode is needed here.
        """
        vocab = self.backend.get_vocab(with_added_tokens=True)
        for start, end in THINK_TOKENS:
            if start in vocab and end in vocab:
                return start, end
        if "<|channel>" in vocab and "<channel|>" in vocab:
            return _CHANNEL_THINK
        if all(t in vocab for t in _XTML_TOKENS):
            return _XTML_THINK
        return None

    @property
    def has_thinking(self) -> bool:
        """mlx-lm's TokenizerWrapper.has_thinking: the vocabulary has thinking markers."""
        return self.think_markers is not None

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """What mlx-lm stops on: the config's eos_token_id(s) plus the tokenizer's EOS."""
        return self._eos_token_ids

    def chat_template(self, name: str | None = None, tools: list[dict] | None = None) -> str:
        if not self.chat_templates:
            raise TokenizerError("this tokenizer has no chat template")
        if name is not None:
            if name not in self.chat_templates:
                raise TokenizerError(f"no chat template named {name!r}")
            return self.chat_templates[name]
        if len(self.chat_templates) == 1 and "default" in self.chat_templates:
            return self.chat_templates["default"]
        if tools is not None and "tool_use" in self.chat_templates:
            return self.chat_templates["tool_use"]
        if "default" not in self.chat_templates:
            raise TokenizerError(f"several chat templates and none is 'default': {sorted(self.chat_templates)}")
        return self.chat_templates["default"]

    def render_chat(
        self,
        messages: list[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        *,
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        template_name: str | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text, as apply_chat_template(..., tokenize=False) returns it.

        The template sees the special tokens (bos_token, eos_token, ...) and then
        `template_kwargs`, which win on a clash, as in transformers.
        """
        return chat_template.render(
            self.chat_template(template_name, tools),
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            documents=documents,
            variables={**self.special_tokens_map, **template_kwargs},
        )

    def render_chat_like_mlx_lm(
        self, messages: list[Mapping[str, Any]], add_generation_prompt: bool = True, **options: Any
    ) -> str:
        """render_chat (same arguments) as mlx-lm's TokenizerWrapper.apply_chat_template calls
        the template: when the caller passes no `enable_thinking`, it is set to
        `self.has_thinking` (so a vocabulary without thinking markers renders with
        enable_thinking=False).

        (The wrapper's renaming of enable_thinking to `thinking` applies only to tokenizer
        classes with their own apply_chat_template, never to a Jinja template: not done.)
        """
        options.setdefault("enable_thinking", self.has_thinking)
        return self.render_chat(messages, add_generation_prompt, **options)


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


def _backend_kind(settings: dict[str, Any], model_config: dict[str, Any], tokenizer_json: str) -> str:
    """Which transformers class AutoTokenizer would build for a Llama directory."""
    if model_config.get("model_type") in _GENERIC_BACKEND_MODEL_TYPES:
        return "file"
    declared = settings.get("tokenizer_class") or model_config.get("tokenizer_class")
    if declared is None:
        return "file"
    name = declared.removesuffix("Fast")
    if name in _FILE_AS_IS_CLASSES:
        return "file"
    if name == "LlamaTokenizer":
        # AutoTokenizer routes a ByteLevel tokenizer.json (Llama 3 style) to the generic
        # backend; only the sentencepiece-style one gets the LlamaTokenizer rebuild.
        return "file" if '"ByteLevel"' in tokenizer_json else "llama"
    if name == "GPT2Tokenizer":
        return "gpt2"
    raise TokenizerError(
        f"tokenizer_class {declared!r}: transformers may rebuild this tokenizer in ways "
        "not reproduced here (supported: PreTrainedTokenizerFast, LlamaTokenizer, GPT2Tokenizer)"
    )


def _chat_templates(path: Path, from_config: Any) -> dict[str, str]:
    """Templates by name; chat_template.jinja and chat_templates/ win over the config."""
    from_files: dict[str, str] = {}
    if (path / "chat_template.jinja").exists():
        from_files["default"] = (path / "chat_template.jinja").read_text(encoding="utf-8")
    template_dir = path / "chat_templates"
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


def _build_backend(
    kind: str, tokenizer_file: Path, tokenizer_json: dict[str, Any], settings: dict[str, Any]
) -> Tokenizer:
    if kind == "file":
        return Tokenizer.from_file(str(tokenizer_file))
    model = tokenizer_json.get("model", {})
    if model.get("type") != "BPE":
        raise TokenizerError(f"{kind} tokenizer expects a BPE tokenizer.json model")
    vocab = model["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    if kind == "gpt2":
        backend = Tokenizer(
            BPE(
                vocab=vocab,
                merges=merges,
                dropout=None,
                continuing_subword_prefix="",
                end_of_word_suffix="",
                fuse_unk=False,
            )
        )
        add_prefix_space = bool(settings.get("add_prefix_space", False))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
        backend.decoder = decoders.ByteLevel()
    else:
        backend = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None))
        add_prefix_space = settings.get("add_prefix_space")
        add_prefix_space = True if add_prefix_space is None else add_prefix_space
        legacy = settings.get("legacy", False)
        prepend = ("first" if not legacy else "always") if add_prefix_space else "never"
        backend.normalizer = None
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend, split=False)
        steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        if add_prefix_space:
            steps.append(decoders.Strip(content=" ", left=1))
        backend.decoder = decoders.Sequence(steps)
    # The rebuilt pipeline keeps tokenizer.json's post-processor.
    if tokenizer_json.get("post_processor"):
        original = Tokenizer.from_file(str(tokenizer_file))
        backend.post_processor = original.post_processor
    return backend


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


def _clean_up_tokenization(text: str) -> str:
    for before, after in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text
