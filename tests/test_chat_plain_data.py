"""Python-object chat inputs (models/universal/chat_template.py: plain_data, _normalize_messages):
what an API caller may pass that no profile can (a profile's YAML and the fuzzer's strategies
give only JSON types, so coverage-exempt.yaml names these branches with this file). Each value is
rebuilt from plain JSON types before the template sees it: subclasses lose their class, tuples
stay tuples, numpy scalars become their Python value (np.bool_(False) stays false), dataclasses
become dicts, anything else a "<TypeName>" string; a dataclass message is read field by field."""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

from models.universal.chat_template import plain_data, render


class Loud(str):
    pass


class Count(int):
    pass


class Ratio(float):
    pass


class Color(enum.Enum):
    RED = 1


@dataclasses.dataclass
class Message:
    role: str
    content: str
    name: str | None = None


def test_subclasses_become_their_plain_type() -> None:
    for value, kind in ((Loud("hi"), str), (Count(3), int), (Ratio(0.5), float)):
        rebuilt = plain_data(value)
        assert type(rebuilt) is kind and rebuilt == value


def test_containers_numpy_and_dataclasses_are_rebuilt() -> None:
    assert plain_data((Loud("a"), [Count(1)])) == ("a", [1])
    assert type(plain_data((1, 2))) is tuple
    assert plain_data(np.bool_(False)) is False
    assert plain_data(np.float32(0.25)) == 0.25 and type(plain_data(np.int64(7))) is int
    assert plain_data(Message("user", "hi")) == {"role": "user", "content": "hi", "name": None}
    assert plain_data(Color.RED) == "<Color>"
    assert plain_data(Message) == "<type>"  # a dataclass type is not an instance


def test_a_dataclass_message_renders_as_its_fields_and_a_numpy_false_stays_false() -> None:
    source = "{% for m in messages %}{{ m.role }}:{{ m.content }}|{% endfor %}{% if flag %}FLAG{% endif %}"
    out = render(source, [Message("user", "hi")], add_generation_prompt=False, variables={"flag": np.bool_(False)})
    assert out == "user:hi|"
