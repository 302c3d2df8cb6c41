"""Tool-call text -> calls with typed arguments: the MiniCPM5 format.

MiniCPM5's chat template asks for `<function name="fn"><param name="p">value</param></function>`,
consecutive blocks for parallel calls, a value holding `<`, `&` or a newline wrapped in
`<![CDATA[...]]>`. The response splitter strips the call markers (`<function name=` and
`</function>`), so a call arrives as `"fn"><param ...>...`; the full form is read too.

Each value is typed by the tool's JSON schema for that parameter (the `tools` of the request):
the schema's types (`type`, a list of types, types implied by `enum` values, and those of
`anyOf` / `oneOf` / `allOf`, recursively; none found, an unknown parameter or a schema that is
not a mapping: string) are tried most specific first: integer, number, boolean, object/array
(JSON, then a Python literal), string. The text `null` (any case) is None whatever the type;
`none` and `nil` too where null is allowed.
A value no type accepts is JSON if it parses, else the text.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

CALL_START = "<function name="
CALL_END = "</function>"

_NAME = r"(?P<name>\"[^\"]*\"|'[^']*'|[^\s\"'<>]+)"
_CALL = re.compile(r"(?:<function\s+)?(?:name\s*=\s*)?" + _NAME + r"\s*>(?P<body>.*?)(?:</function>|$)", re.DOTALL)
_PARAM = re.compile(r"<param\s+name\s*=\s*" + _NAME + r"\s*>(?P<value>.*?)</param>", re.DOTALL)
_CDATA = re.compile(r"\s*<!\[CDATA\[(.*?)\]\]>\s*", re.DOTALL)


class ToolCallError(ValueError):
    """The text holds no call (the server drops such a call and logs a warning)."""


def unquote(name: str) -> str:
    name = name.strip()
    if any(name.startswith(q) and name.endswith(q) for q in "\"'"):
        return name[1:-1]
    return name


def schema_types(schema: Any) -> set[str]:
    """Every type a JSON schema allows (see the module docstring); {"string"} when none."""
    if not isinstance(schema, dict):
        return {"string"}
    found: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        found.add(declared)
    elif isinstance(declared, list):
        found.update(t for t in declared if isinstance(t, str))
    enum = schema.get("enum")
    if isinstance(enum, list):
        found.update(t for t in map(_json_type, enum) if t is not None)
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            for choice in schema[key]:
                found |= schema_types(choice)
    return found or {"string"}


# JSON Schema's type of a Python value, first match wins (bool before int: a bool is an int).
_JSON_TYPES: tuple[tuple[type, str], ...] = (
    (type(None), "null"),
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def _json_type(value: Any) -> str | None:
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), None)


def _as_integer(text: str) -> Any:
    return int(text)


def _as_number(text: str) -> Any:
    """A number; an integral one as an int (3.0 -> 3)."""
    value = float(text)
    return int(value) if value == int(value) else value


def _as_boolean(text: str) -> Any:
    word = text.strip().lower()
    if word in ("true", "1", "yes", "on"):
        return True
    if word in ("false", "0", "no", "off"):
        return False
    raise ValueError(word)


def _as_structure(text: str) -> Any:
    try:
        return json.loads(text, strict=False)
    except json.JSONDecodeError:
        return ast.literal_eval(text)


# Most specific first; each reader raises ValueError (or SyntaxError) when the text is not one.
_READERS = (
    (("integer", "int"), _as_integer),
    (("number", "float"), _as_number),
    (("boolean", "bool"), _as_boolean),
    (("object", "array"), _as_structure),
    (("string", "str", "text"), str),
)


def typed_value(text: str, types: set[str]) -> Any:
    if text.lower() == "null":
        return None
    wanted = {t.lower() for t in types}
    if "null" in wanted and text.lower() in ("none", "nil"):
        return None
    for names, reader in _READERS:
        for name in names:  # each spelling is one more attempt, as a type list may hold both
            if name not in wanted:
                continue
            try:
                return reader(text)
            except (ValueError, SyntaxError):
                continue
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _param_text(raw: str) -> str:
    cdata = _CDATA.fullmatch(raw)
    return cdata.group(1) if cdata is not None else raw.strip()


def parameter_schemas(tools: list[dict] | None) -> dict[str, dict]:
    """Function name -> its parameters' `properties`, from OpenAI-style tools."""
    schemas: dict[str, dict] = {}
    for tool in tools or []:
        function = tool.get("function")
        if function and function.get("parameters"):
            schemas[function["name"]] = function["parameters"].get("properties", {})
    return schemas


def parse_minicpm5(text: str, tools: list[dict] | None) -> list[dict[str, Any]]:
    """The calls in one tool-call text: [{"name", "arguments"}], in order."""
    calls = list(_CALL.finditer(text))
    if not calls:
        raise ToolCallError(f"no function call in {text!r}")
    schemas = parameter_schemas(tools)
    parsed = []
    for call in calls:
        name = unquote(call.group("name"))
        properties = schemas.get(name, {})
        arguments = {}
        for param in _PARAM.finditer(call.group("body")):
            key = unquote(param.group("name"))
            types = schema_types(properties[key]) if key in properties else {"string"}
            arguments[key] = typed_value(_param_text(param.group("value")), types)
        parsed.append({"name": name, "arguments": arguments})
    return parsed
