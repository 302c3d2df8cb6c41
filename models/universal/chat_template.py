"""Chat templates rendered the way transformers 5 renders them (apply_chat_template).

The environment is transformers' sandbox: trim_blocks and lstrip_blocks, the loopcontrols
extension, a `{% generation %}` block that renders its body, `raise_exception`,
`strftime_now`, a `tojson` that does not HTML-escape, and guarded `dict`/`namespace`.
Inputs are reduced to plain JSON data first and None-valued message keys are dropped,
because transformers does both and templates branch on them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Names a message's reasoning arrives under; templates read the first.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text; we only render it."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


class _TemplateDict:
    """`dict(...)` for templates, without exposing the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """A namespace that refuses underscore names, so templates cannot reach internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - mirrors jinja's signature
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot set underscore attributes on a namespace: {name!r}"
            )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson HTML-escapes (<, >, &, '); chat templates expect raw JSON.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env.from_string(source)


def plain_data(value: Any) -> Any:
    """Rebuild a value from plain JSON types; anything else becomes "<TypeName>"."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_data(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_data(v) for v in value)
    if isinstance(value, np.generic):
        return plain_data(value.item())  # np.bool_(False) must not become a truthy string
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"


def _normalize_messages(messages: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    normalized = []
    for message in messages:
        if dataclasses.is_dataclass(message) and not isinstance(message, type):
            message = {f.name: getattr(message, f.name) for f in dataclasses.fields(message)}
        if not isinstance(message, Mapping):
            raise TypeError(f"chat messages must be dicts, got {message!r}")
        # APIs often send content=None; templates handle a missing key, not a None.
        normalized.append({k: v for k, v in message.items() if v is not None})
    return normalized


def _alias_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    aliased = []
    for message in messages:
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        aliased.append(message)
    return aliased


def render(
    source: str,
    messages: list[Mapping[str, Any]],
    *,
    add_generation_prompt: bool,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """Render one conversation; `variables` are the extra names the template sees."""
    if not messages:
        raise ValueError("cannot render an empty conversation")
    chat = _alias_reasoning(plain_data(_normalize_messages(messages)))
    return compile_template(source).render(
        messages=chat,
        tools=plain_data(tools),
        documents=plain_data(documents),
        add_generation_prompt=add_generation_prompt,
        **plain_data(dict(variables or {})),
    )
