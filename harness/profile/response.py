"""A scenario's `response:` key (the `response` check): mlx-lm's server split of the generated
tokens, and of forced texts, into reasoning, content and tool calls (docs/profiles.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from harness.errors import ProfileError
from harness.oracle.descriptor import has_feature, with_feature


@dataclass(frozen=True)
class ForcedText:
    """A text both sides encode (without special tokens: `<|im_end|>` is the EOS id) and then
    answer as if the model had generated exactly those tokens."""

    id: str
    text: str


@dataclass(frozen=True)
class ResponseSpec:
    forced: list[ForcedText] = field(default_factory=list)

    def validate(self, where: str) -> None:
        seen = set()
        for i, item in enumerate(self.forced):
            if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", item.id):
                raise ProfileError(f"{where}.forced[{i}].id: expected lowercase [a-z0-9_-], got {item.id!r}")
            if item.id in seen or item.id == "generated":
                raise ProfileError(f"{where}.forced[{i}].id: {item.id!r} is taken (ids are unique, not 'generated')")
            seen.add(item.id)
            if not item.text:
                raise ProfileError(f"{where}.forced[{i}].text: expected a non-empty text")

    def spec(self) -> dict:
        return {"forced": [{"id": f.id, "text": f.text} for f in self.forced]}


def check_response_scenario(scenario, checks: list[str], oracle: str, where: str) -> None:
    """`response:` is served on a chat scenario judged by mlx-lm (that the key and the check go
    together is the registry row's `applies` / `wanted`)."""
    if scenario.response is None:
        return
    if scenario.messages is None or scenario.composition is not None:
        raise ProfileError(f"{where}.response: only a chat scenario ('messages', no composition) is served")
    if not has_feature(oracle, "response"):
        raise ProfileError(
            f"{where}.response: judged against {' or '.join(with_feature('response'))}'s server, not {oracle}"
        )
