"""What users feed a chat model, as Hypothesis strategies: scenarios of a language-model profile.

An example is a profile scenario (the mapping a profile's YAML holds), so that a failing one,
shrunk, is written out as a scenario the profile can keep. What varies:

- texts built from the chat template's markers (reasoning `<think>`/`</think>`, the end of a
  turn, the tool-call markers of the MiniCPM5 XML format with their parameters, CDATA) and from
  pieces that are hard for a streaming detokenizer (accents, CJK, an emoji: several tokens a
  character), so that a marker shares its piece with text and a character is split at every
  boundary; odd argument spellings (integral floats, None, booleans, JSON and Python literals);
- forced first tokens: such a text's token ids cut anywhere (mid-character, mid-marker), with an
  end-of-sequence id put at any position (a mid-stream EOS), optionally stopping there;
- the `response` check's forced texts (mlx-lm's server split of them);
- cache schedules: a rotating window (`max_kv_size`, keep 4) small enough to wrap, prefill
  chunk sizes, quantized KV (4 or 8 bits) starting at any offset, several turns on one cache.

Token ids come from the artifact's own tokenizer.json through the `tokenizers` library (what
mlx-lm's tokenizer wraps), never from the implementation under test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

MARKERS = (
    "<think>",
    "</think>",
    "<|im_end|>",
    '<function name="get_weather">',
    '<function name="book_table">',
    '<param name="city">',
    '<param name="days">',
    '<param name="guests">',
    '<param name="budget">',
    '<param name="notes">',
    "</param>",
    "</function>",
    "<![CDATA[",
    "]]>",
)
PIECES = (
    " ",
    "\n",
    "\n\n",
    "Paris",
    " the weather",
    "Café",
    " naïve",
    "東京",
    " 東",
    "😀",
    "<",
    "&",
    "2",
    "40.0",
    "12.5",
    "None",
    "null",
    "true",
    "yes",
    '{"seat": "window"}',
    "['quiet', 'vegan']",
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": ["integer", "null"]}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book_table",
            "description": "Book a restaurant table",
            "parameters": {
                "type": "object",
                "properties": {
                    "guests": {"type": "integer"},
                    "budget": {"type": "number"},
                    "notes": {"type": "string"},
                },
            },
        },
    },
]
USER_TEXTS = (
    "Hi.",
    "What is the capital of France?",
    "Book a table for three and check the weather in Paris.",
    "Write something with accents, kanji and an emoji.",
    "Tell me a long story about a lighthouse keeper and the storm.",
)

Encode = Callable[[str], list[int]]


def texts() -> st.SearchStrategy[str]:
    """Marker-and-piece texts: every marker next to text, multibyte characters anywhere."""
    return st.lists(st.sampled_from(MARKERS + PIECES), min_size=1, max_size=10).map("".join)


@st.composite
def forced_prefix(draw: st.DrawFn, encode: Encode, eos_ids: list[int]) -> list[int]:
    """A text's token ids, cut anywhere, with an EOS id put anywhere (or none)."""
    ids = encode(draw(texts()))
    ids = ids[: draw(st.integers(1, max(1, len(ids))))] or ids
    if draw(st.booleans()):
        at = draw(st.integers(0, len(ids)))
        ids = [*ids[:at], draw(st.sampled_from(eos_ids)), *ids[at:]]
    return ids


def _cache_schedule(draw: st.DrawFn, prompt_tokens_hint: int) -> dict[str, Any]:
    """Rotating window, prefill chunks or quantized KV (mlx-lm has no quantized rotating cache)."""
    out: dict[str, Any] = {}
    kind = draw(st.sampled_from(["plain", "rotating", "quantized"]))
    if kind == "rotating":
        out["max_kv_size"] = draw(st.integers(8, 2 * prompt_tokens_hint))
    elif kind == "quantized":
        out["kv_bits"] = draw(st.sampled_from([4, 8]))
        out["kv_group_size"] = 64
        out["quantized_kv_start"] = draw(st.integers(0, 2 * prompt_tokens_hint))
    if draw(st.booleans()):
        out["prefill_step_size"] = draw(st.integers(1, 64))
    return out


@st.composite
def chat_scenarios(draw: st.DrawFn, encode: Encode, eos_ids: list[int], max_steps: int = 12) -> dict[str, Any]:
    """A chat scenario of a language-model profile (no `id`: the runner names it)."""
    scenario: dict[str, Any] = {"steps": draw(st.integers(1, max_steps))}
    thinking = draw(st.sampled_from([None, True, False]))
    kwargs: dict[str, Any] = {} if thinking is None else {"enable_thinking": thinking}
    with_tools = draw(st.booleans())
    if with_tools:
        kwargs["tools"] = TOOLS
    if kwargs:
        scenario["template_kwargs"] = kwargs
    user = st.one_of(st.sampled_from(USER_TEXTS), texts())
    n_turns = draw(st.integers(1, 3))
    if n_turns == 1:
        scenario["messages"] = [{"role": "user", "content": draw(user)}]
    else:
        scenario["turns"] = [[{"role": "user", "content": draw(user)}] for _ in range(n_turns)]
    scenario |= _cache_schedule(draw, 48)
    if draw(st.booleans()):
        scenario["forced_prefix"] = draw(forced_prefix(encode, eos_ids))
        if n_turns == 1 and draw(st.booleans()):
            scenario["stop"] = "eos"
    if n_turns == 1 and "max_kv_size" not in scenario and "kv_bits" not in scenario and draw(st.booleans()):
        forced = draw(st.lists(texts(), min_size=1, max_size=3))
        scenario["response"] = {"forced": [{"id": f"text-{i}", "text": t} for i, t in enumerate(forced)]}
    return scenario
