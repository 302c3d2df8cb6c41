"""LlamaConfig: config.json validated into one typed object.

Field names and defaults follow mlx-lm's `models/llama.py` ModelArgs, because that is the
model we must match bit for bit (e.g. `tie_word_embeddings` defaults to True there, unlike
in transformers). Unknown keys are ignored as mlx-lm ignores them, but recorded in
`unused_keys` so a caller can see what was dropped. A missing required key or a value of
the wrong type is a ConfigError naming the key.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from models.universal.errors import ConfigError

# config.json model types that mlx-lm 0.32.2 builds with models/llama.py (MODEL_REMAPPING).
LLAMA_MODEL_TYPES = frozenset({"llama", "mistral", "iquestcoder", "xverse"})

# Rope scalings mlx-lm's initialize_rope supports that make sense for a Llama, with the
# keys each one reads without a default.
ROPE_REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    # transformers 5 (which loads the oracle's config) refuses a llama3 rope without both band factors.
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "yarn": ("factor",),
    "longrope": ("original_max_position_embeddings", "short_factor", "long_factor"),
}

QUANT_MODES = ("affine", "mxfp4", "nvfp4", "mxfp8")
_MODE_DEFAULTS = {"affine": (64, 4), "mxfp4": (32, 4), "nvfp4": (16, 4), "mxfp8": (32, 8)}


@dataclass(frozen=True)
class QuantSpec:
    """How one module's weight is packed: the arguments of `to_quantized`."""

    group_size: int
    bits: int
    mode: str = "affine"

    def as_kwargs(self) -> dict[str, Any]:
        return {"group_size": self.group_size, "bits": self.bits, "mode": self.mode}


@dataclass(frozen=True)
class QuantizationConfig:
    """config.json's `quantization` section, as mlx-lm writes it.

    `default` is the global group_size/bits/mode. `per_module` holds the entries keyed
    by a module path ("model.embed_tokens"): a QuantSpec for an override, None for an
    explicit `false` (keep that module unquantized).
    """

    default: QuantSpec
    per_module: dict[str, QuantSpec | None] = field(default_factory=dict)


@dataclass(frozen=True)
class LlamaConfig:
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    rms_norm_eps: float
    vocab_size: int
    head_dim: int | None = None
    max_position_embeddings: int | None = None
    num_key_value_heads: int | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    rope_theta: float = 10000
    rope_traditional: bool = False
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = True
    eos_token_id: int | list[int] | None = None
    quantization: QuantizationConfig | None = None
    unused_keys: tuple[str, ...] = ()

    @property
    def n_kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def attention_head_dim(self) -> int:
        # mlx-lm uses `args.head_dim or hidden_size // n_heads`; mirror the `or`.
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def rope_type(self) -> str:
        if self.rope_scaling is None:
            return "default"
        return self.rope_scaling.get("type") or self.rope_scaling.get("rope_type", "default")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LlamaConfig:
        """Validate a parsed config.json; raise ConfigError naming the first bad key."""
        if not isinstance(raw, dict):
            raise ConfigError(f"config: expected a JSON object, got {type(raw).__name__}")
        known = {f.name for f in fields(cls)} - {"quantization", "unused_keys"}
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in raw and f.name in known:
                values[f.name] = raw[f.name]
        for name in _REQUIRED:
            if name not in raw:
                raise ConfigError(f"config: required key {name!r} is missing")
        _check_types(values)
        layer_types = raw.get("layer_types")
        if layer_types is not None and any(t != "full_attention" for t in layer_types):
            raise ConfigError(
                f"config.layer_types: only 'full_attention' layers are supported (got {sorted(set(layer_types))})"
            )
        if "quantization" in raw:
            values["quantization"] = _parse_quantization(raw["quantization"])
        elif "quantization_config" in raw:
            legacy = raw["quantization_config"]
            method = legacy.get("quant_method") if isinstance(legacy, dict) else None
            raise ConfigError(
                "config.quantization_config: only MLX-native 'quantization' sections are "
                f"supported (found quant_method={method!r} without 'quantization')"
            )
        # Both sections are written by mlx-lm's convert; the legacy copy is not "unused".
        consumed = known | {"quantization", "quantization_config", "layer_types"}
        values["unused_keys"] = tuple(sorted(k for k in raw if k not in consumed))
        config = cls(**values)
        config._validate()
        return config

    @classmethod
    def from_file(cls, path: str | Path) -> LlamaConfig:
        return cls.from_dict(read_config_json(path))

    def _validate(self) -> None:
        if self.model_type not in LLAMA_MODEL_TYPES:
            raise ConfigError(
                f"config.model_type: {self.model_type!r} is not a Llama (expected one of {sorted(LLAMA_MODEL_TYPES)})"
            )
        for name in ("hidden_size", "num_hidden_layers", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"config.{name}: must be positive, got {getattr(self, name)}")
        if self.num_attention_heads <= 0 or self.vocab_size <= 0:
            raise ConfigError("config.num_attention_heads / vocab_size: must be positive")
        if self.n_kv_heads <= 0 or self.num_attention_heads % self.n_kv_heads:
            raise ConfigError(
                f"config.num_key_value_heads: {self.n_kv_heads} does not divide "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if not self.head_dim and self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"config.head_dim: absent, and hidden_size={self.hidden_size} is not a "
                f"multiple of num_attention_heads={self.num_attention_heads}"
            )
        if self.rms_norm_eps <= 0:
            raise ConfigError(f"config.rms_norm_eps: must be positive, got {self.rms_norm_eps}")
        self._validate_rope()

    def _validate_rope(self) -> None:
        if self.rope_scaling is None:
            return
        rope_type = self.rope_type
        if rope_type not in ROPE_REQUIRED_KEYS:
            raise ConfigError(
                f"config.rope_scaling.rope_type: {rope_type!r} is not supported "
                f"(expected one of {sorted(ROPE_REQUIRED_KEYS)})"
            )
        for key in ROPE_REQUIRED_KEYS[rope_type]:
            if key not in self.rope_scaling:
                raise ConfigError(f"config.rope_scaling.{key}: required for rope_type {rope_type!r}")
        if rope_type in ("dynamic", "longrope") and self.max_position_embeddings is None:
            raise ConfigError(f"config.max_position_embeddings: required for rope_type {rope_type!r}")


_REQUIRED = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "rms_norm_eps",
    "vocab_size",
)
_INT_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "vocab_size",
)
_OPTIONAL_INT_KEYS = ("head_dim", "max_position_embeddings", "num_key_value_heads")
_FLOAT_KEYS = ("rms_norm_eps", "rope_theta")
_BOOL_KEYS = ("attention_bias", "mlp_bias", "rope_traditional", "tie_word_embeddings")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_types(values: dict[str, Any]) -> None:
    def expected(key: str, what: str) -> ConfigError:
        return ConfigError(f"config.{key}: expected {what}, got {values[key]!r}")

    if not isinstance(values["model_type"], str):
        raise expected("model_type", "a string")
    for key in _INT_KEYS:
        if not _is_int(values[key]):
            raise expected(key, "an integer")
    for key in _OPTIONAL_INT_KEYS:
        if values.get(key) is not None and not _is_int(values[key]):
            raise expected(key, "an integer or null")
    for key in _FLOAT_KEYS:
        if key in values and (not isinstance(values[key], (int, float)) or isinstance(values[key], bool)):
            raise expected(key, "a number")
    for key in _BOOL_KEYS:
        if key in values and not isinstance(values[key], bool):
            raise expected(key, "true or false")
    if values.get("rope_scaling") is not None and not isinstance(values["rope_scaling"], dict):
        raise expected("rope_scaling", "an object or null")
    eos = values.get("eos_token_id")
    if eos is not None and not _is_int(eos) and not (isinstance(eos, list) and all(_is_int(i) for i in eos)):
        raise expected("eos_token_id", "an integer, a list of integers or null")


def _parse_spec(where: str, raw: dict[str, Any]) -> QuantSpec:
    unknown = set(raw) - {"group_size", "bits", "mode"}
    if unknown:
        raise ConfigError(f"{where}: unsupported keys {sorted(unknown)}")
    mode = raw.get("mode", "affine")
    if mode not in QUANT_MODES:
        raise ConfigError(f"{where}.mode: {mode!r} is not one of {list(QUANT_MODES)}")
    # nn.quantize fills a missing group_size/bits from the mode's defaults.
    group_default, bits_default = _MODE_DEFAULTS[mode]
    group_size = raw.get("group_size") or group_default
    bits = raw.get("bits") or bits_default
    if not _is_int(group_size) or not _is_int(bits):
        raise ConfigError(f"{where}: group_size and bits must be integers")
    if bits not in (2, 3, 4, 5, 6, 8):
        raise ConfigError(f"{where}.bits: {bits} is not a supported bit width")
    if group_size not in (16, 32, 64, 128):
        raise ConfigError(f"{where}.group_size: {group_size} is not a supported group size")
    return QuantSpec(group_size=group_size, bits=bits, mode=mode)


def _parse_quantization(raw: Any) -> QuantizationConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"config.quantization: expected an object, got {raw!r}")
    globals_ = {k: raw[k] for k in ("group_size", "bits", "mode") if k in raw}
    default = _parse_spec("config.quantization", globals_)
    per_module: dict[str, QuantSpec | None] = {}
    for key, value in raw.items():
        if key in ("group_size", "bits", "mode"):
            continue
        where = f"config.quantization[{key!r}]"
        if value is False:
            per_module[key] = None
        elif value is True:
            per_module[key] = default
        elif isinstance(value, dict):
            per_module[key] = _parse_spec(where, value)
        else:
            raise ConfigError(f"{where}: expected an object, true or false, got {value!r}")
    return QuantizationConfig(default=default, per_module=per_module)


# transformers writes non-finite floats as {"__float__": "Infinity"} so config.json stays
# valid JSON; mlx-lm decodes them back, and so do we.
_FLOAT_TAGS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def _decode_tagged_floats(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"__float__"} and obj["__float__"] in _FLOAT_TAGS:
            return _FLOAT_TAGS[obj["__float__"]]
        return {k: _decode_tagged_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode_tagged_floats(v) for v in obj]
    return obj


def read_config_json(path: str | Path) -> dict[str, Any]:
    """Parse a config.json (a file, or the directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        with open(path, encoding="utf-8") as f:
            return _decode_tagged_floats(json.load(f))
    except FileNotFoundError as e:
        raise ConfigError(f"config: {path} not found") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"config: {path} is not valid JSON ({e})") from e
