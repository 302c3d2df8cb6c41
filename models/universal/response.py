"""A generated token stream -> OpenAI-style chat responses: `reasoning`, `content` and
`tool_calls`, chunk by chunk (streaming) and whole (non-streaming), as mlx-lm's server answers
a chat completion (mlx-lm 0.32.2: its detokenizer, stop rule, text state machine and tool-call
formatting; the semantics are restated here, nothing is imported from mlx-lm).

- Text: the streaming detokenizer of the `detokenize` check (models/universal/detokenize.py,
  mlx-lm's detokenizer semantics: a split UTF-8 character or a lone space is held back, the
  first text loses a leading space). Generation ends at the first EOS id (not detokenized) or after `max_tokens`.
- Split: states `normal`, `reasoning` and `tool`. `normal` -> `reasoning` on the think start
  marker, back on its end; `normal` and `reasoning` -> `tool` on the call start marker, back
  to `normal` on its end. Markers are matched on text and stripped; text that may still
  become a marker is held until it cannot. A run that ends at EOS drops what is held; one
  that ends at max_tokens emits it. The initial state is `reasoning` when the prompt's last
  think start comes after its last think end.
- Chunks: after each token, unless inside a call, the text, reasoning and finished calls
  gathered since the last chunk make one chunk (when any is non-empty); a last chunk carries
  the finish reason (`tool_calls` for a stop after a call). Calls that do not parse are dropped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from models.universal.detokenize import stream_of
from models.universal.errors import TokenizerError
from models.universal.tool_calls import CALL_END, CALL_START, ToolCallError, parse_minicpm5


@dataclass
class Splitter:
    """The text state machine: per state, the markers that leave it (text -> next state)."""

    edges: dict[str, list[tuple[str, str]]]
    state: str = "normal"
    pending: str = ""

    def split(self, text: str) -> list[tuple[str, str]]:
        """(state, text) per state passed; the last is the current state."""
        buf = self.pending + text
        segments: list[tuple[str, str]] = []
        begin = safe = 0
        for i in range(len(self.pending), len(buf)):
            window = buf[safe : i + 1]
            markers = {m: dst for m, dst in self.edges.get(self.state, [])}  # a repeated marker: the last edge
            hits = [m for m in markers if window.endswith(m)]
            if hits:
                marker = max(hits, key=len)
                segments.append((self.state, buf[begin : i + 1 - len(marker)]))
                begin = safe = i + 1
                self.state = markers[marker]
                continue
            if not any(m.startswith(window[-k:]) for m in markers for k in range(1, min(len(m), len(window)) + 1)):
                safe = i + 1  # no suffix can still grow into a marker: all of it is text
        segments.append((self.state, buf[begin:safe]))
        self.pending = buf[safe:]
        return segments

    def flush(self) -> str:
        held, self.pending = self.pending, ""
        return held


@dataclass
class Chat:
    """What the server's response objects carry, ids and timestamps left out."""

    stream: list[dict[str, Any]] = field(default_factory=list)
    whole: dict[str, Any] = field(default_factory=dict)


def initial_state(prompt_ids: Sequence[int], think_ids: tuple[list[int], list[int]] | None) -> str:
    if think_ids is None:
        return "normal"
    start, end = (_rfind(prompt_ids, ids) for ids in think_ids)
    return "reasoning" if start > end else "normal"


def _rfind(seq: Sequence[int], pattern: Sequence[int]) -> int:
    for i in range(len(seq) - len(pattern), -1, -1):
        if list(seq[i : i + len(pattern)]) == list(pattern):
            return i
    return -1


class ResponseBuilder:
    """The in-tree answer to one chat request over a given token stream."""

    def __init__(self, tokenizer: Any, tools: list[dict] | None, parser: str | None):
        self.tokenizer = tokenizer
        self.tools = tools
        self.stream = stream_of(tokenizer)  # the detokenize check's stream, as mlx-lm's server uses its detokenizer
        markers = tokenizer.think_markers
        self.think = markers
        self.think_ids = None
        if markers is not None:
            self.think_ids = tuple(
                [tokenizer.token_id(m)] if tokenizer.token_id(m) is not None else tokenizer.encode(m, False)
                for m in markers
            )
        if parser not in (None, "minicpm5"):
            raise TokenizerError(f"response: tool parser {parser!r} is not implemented in-tree (minicpm5 is)")
        self.parser = parser
        edges: dict[str, list[tuple[str, str]]] = {}
        if markers is not None:
            edges.setdefault("normal", []).append((markers[0], "reasoning"))
            edges["reasoning"] = [(markers[1], "normal")]
        if parser is not None:
            edges.setdefault("normal", []).append((CALL_START, "tool"))
            if markers is not None:
                edges["reasoning"].append((CALL_START, "tool"))
            edges["tool"] = [(CALL_END, "normal")]
        self.edges = edges

    def texts(self, tokens: Sequence[int], max_tokens: int) -> list[tuple[str, int, str | None]]:
        """(text, token, finish reason) per response of the generation loop."""
        eos = self.tokenizer.eos_token_ids
        stream = self.stream
        stream.reset()
        out: list[tuple[str, int, str | None]] = []
        token = None
        for n, token in enumerate(tokens[:max_tokens]):
            if token in eos:
                break
            stream.add(token)
            if n + 1 == max_tokens:
                break
            out.append((stream.segment(), token, None))
        if token is None:
            raise ValueError("response: no tokens to answer with")
        stream.finalize()
        out.append((stream.segment(), token, "stop" if token in eos else "length"))
        return out

    def calls(self, texts: list[str], counter: list[int] | None) -> list[dict[str, Any]]:
        """The formatted calls of these tool texts (streaming: numbered by `counter`)."""
        formatted = []
        for text in texts:
            try:
                parsed = parse_minicpm5(text, self.tools)
            except ToolCallError:
                continue
            for call in parsed:
                entry = {
                    "function": {"name": call["name"], "arguments": json.dumps(call["arguments"], ensure_ascii=False)},
                    "type": "function",
                }
                if counter is not None:
                    entry["index"] = counter[0]
                    counter[0] += 1
                formatted.append(entry)
        return formatted

    def answer(self, prompt_ids: Sequence[int], tokens: Sequence[int], max_tokens: int) -> dict[str, Any]:
        start = initial_state(prompt_ids, self.think_ids)
        responses = self.texts(tokens, max_tokens)
        out: dict[str, Any] = {"initial_state": start, "tokens": [t for _, t, _ in responses]}
        for streaming in (True, False):
            key = "stream" if streaming else "whole"
            out[key] = self._serve(start, responses, streaming, len(prompt_ids))
        return out

    def _serve(self, start: str, responses, streaming: bool, prompt_length: int) -> Any:
        splitter = Splitter(self.edges, start)
        counter = [0] if streaming else None
        chunks = []
        previous, finish, text, reasoning, tool_text, calls, called = start, "stop", "", "", "", [], False
        for piece, _, reason in responses:
            if reason == "stop":
                splitter.pending = ""
                segments = [(splitter.state, "")]
            else:
                segments = splitter.split(piece)
                if reason == "length":
                    segments.append((splitter.state, splitter.flush()))
            for state, clean in segments:
                if state == "reasoning":
                    reasoning += clean
                elif state == "tool":
                    tool_text += clean
                elif state == "normal":
                    if previous == "tool":
                        calls.append(tool_text)
                        tool_text, called = "", True
                    text += clean
                previous = state
            if streaming and segments[-1][0] != "tool" and (text or calls or reasoning):
                chunks.append(self._chunk(text, None, self.calls(calls, counter), reasoning, True))
                text, reasoning, calls = "", "", []
            if reason is not None:
                finish = reason
        if previous == "tool" and tool_text:
            calls.append(tool_text)
            called = True
        if finish == "stop" and called:
            finish = "tool_calls"
        last = self._chunk(text, finish, self.calls(calls, counter), reasoning, streaming)
        if streaming:
            return [*chunks, last]
        return last | {"usage": {"prompt_tokens": prompt_length, "completion_tokens": len(responses)}}

    @staticmethod
    def _chunk(text: str, finish: str | None, calls: list, reasoning: str, streaming: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"role": "assistant"}
        if not streaming:
            body["content"] = text or None
        elif text:
            body["content"] = text
        if reasoning:
            body["reasoning"] = reasoning
        if calls:
            body["tool_calls"] = calls
        return {"finish_reason": finish, "delta" if streaming else "message": body}


# mlx-lm 0.32.2's inference of a tool-call format, in its order: from the chat template's text,
# else from the vocabulary. Only minicpm5 is implemented in-tree; any other is refused.
_TEMPLATE_FORMATS = (
    ("minimax_m2", (("<minimax:tool_call>",),)),
    ("gemma4", (("<|tool_call>", "<tool_call|>"),)),
    ("function_gemma", (("<start_function_call>",),)),
    ("longcat", (("<longcat_tool_call>",),)),
    ("glm47", (("<arg_key>",),)),
    ("pythonic", (("<|tool_list_start|>",), ("<|tool_call_start|>",))),
    ("qwen3_coder", (("<tool_call>\\n<function=",), ("<tool_call>\n<function=",))),
    ("kimi_k2", (("<|tool_calls_section_begin|>",),)),
    ("minicpm5", (('<function name="', '<param name="'),)),
    ("mistral", (("[TOOL_CALLS]",),)),
    ("muse_spark", (("<atem:function_calls>",),)),
    ("json_tools", (("<tool_call>", "tool_call.name"),)),
)
_XTML = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")


def tool_format(tokenizer: Any, settings: dict[str, Any]) -> str | None:
    """The tool-call format mlx-lm would pick: tokenizer_config's `tool_parser_type`, else
    the first whose strings (all of one alternative) the chat template holds, else the vocabulary's."""
    if settings.get("chat_template_type"):
        raise TokenizerError("response: a chat_template_type response format is not implemented in-tree")
    vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
    if all(t in vocab for t in _XTML):
        raise TokenizerError("response: an XTML vocabulary's structural markers are not implemented in-tree")
    if settings.get("tool_parser_type"):
        return settings["tool_parser_type"]
    templates = tokenizer.chat_templates
    if not tokenizer.templates_by_name:  # one template held as a string; a mapping is never searched
        template = next(iter(templates.values()))
        for name, alternatives in _TEMPLATE_FORMATS:
            if any(all(s in template for s in strings) for strings in alternatives):
                return name
    if "<|tool_call_start|>" in vocab and "<|tool_call_end|>" in vocab:
        return "pythonic"
    return None
