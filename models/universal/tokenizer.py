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

This module is the tokenizer and the order of those steps (`ChatTokenizer.from_dir`); the steps
are tokenizer_classes.py (which class, and its rebuilt pipeline), special_tokens.py (the added
and special tokens) and tokenizer_files.py (the directory's other files: templates, eos ids).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, processors

from models.universal import chat_template
from models.universal.errors import TokenizerError
from models.universal.special_tokens import _added_tokens_decoder, _register_tokens, _special_tokens
from models.universal.tokenizer_classes import _backend_kind, _build_backend
from models.universal.tokenizer_files import _chat_templates, _eos_token_ids, _read_json, _read_model_config

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
        templates_by_name: bool | None = None,
    ):
        self.backend = backend
        # tokenizer.json's own decoder, which picks mlx-lm's streaming detokenizer (transformers
        # may rebuild the backend's, e.g. without its Strip step for add_prefix_space: false).
        self.decoder = decoder
        self.special_tokens_map = special_tokens
        self.chat_templates = chat_templates
        # Whether transformers holds the templates as a mapping (names) rather than one string:
        # one `default` alone is a string, unless tokenizer_config.json listed it.
        self.templates_by_name = set(chat_templates) != {"default"} if templates_by_name is None else templates_by_name
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

        config_templates = settings.pop("chat_template", None)
        templates = _chat_templates(path, config_templates)
        # transformers keeps tokenizer_config.json's list as a mapping, even of one template
        listed = isinstance(config_templates, list) and list(templates.items()) == [
            (t.get("name"), t.get("template")) for t in config_templates if isinstance(t, dict)
        ]
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
            templates_by_name=True if listed else None,
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
        `template_kwargs`, which win on a clash, as in transformers. A `chat_template` among them
        is apply_chat_template's option, taken as transformers' get_chat_template takes it: the
        name of one of a mapping's templates picks it, any other string is the template itself.
        """
        chosen = template_kwargs.pop("chat_template", None)
        if chosen is None:
            source = self.chat_template(template_name, tools)
        elif self.templates_by_name and chosen in self.chat_templates:
            source = self.chat_template(chosen)
        else:
            source = chosen
        return chat_template.render(
            source,
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
