"""The typed description of a twin: the Llama shape it copies and how to write it.

A twin is "exact config, seeded random weights": everything a loader, a tokenizer or a
chat renderer can look at is the real artifact's (shapes, quantization, vocabulary size,
special ids, file layout, template behaviour); only the numbers inside the weights and
the BPE merges are made up, from a fixed seed and a fixed corpus.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LlamaShape:
    """The config.json numbers that decide every tensor shape of a dense Llama."""

    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"{self.num_key_value_heads} KV heads do not divide {self.num_attention_heads} query heads"
            )

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def summary(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class QuantSettings:
    """MLX affine quantization applied to every matrix (norms stay unquantized)."""

    group_size: int = 64
    bits: int = 4

    def as_config(self) -> dict[str, int]:
        # Key order as the artifact's config.json has it.
        return {"group_size": self.group_size, "bits": self.bits}


@dataclass(frozen=True)
class TwinSpec:
    """One registered twin.

    `write` fills an empty directory with the artifact's files; it must be a pure
    function of the spec (no clock, no environment), so two builds are byte-identical.
    """

    twin_id: str
    description: str
    seed: int
    shape: LlamaShape
    # None: the matrices unquantized, in `float_dtype` (a float control of a quantized twin: the
    # same seeded draws before they are quantized, docs/quality.md).
    quantization: QuantSettings | None
    num_shards: int
    rope_theta: float
    eos_token_ids: tuple[int, ...]
    write: Callable[[TwinSpec, Path], None]
    float_dtype: str = "float32"  # scales, biases and norms (and so the activations)
    # config.json's rope_scaling as (key, value) pairs (a list value as a tuple), and its
    # max_position_embeddings where the twin's writer default is not wanted (the rope twins).
    rope_scaling: tuple[tuple[str, Any], ...] = ()
    max_positions: int | None = None

    def rope_scaling_config(self) -> dict[str, Any] | None:
        """rope_scaling as config.json has it (None when unset)."""
        if not self.rope_scaling:
            return None
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.rope_scaling}

    def config_summary(self) -> dict[str, Any]:
        return {
            "model_type": "llama",
            **self.shape.summary(),
            "rope_theta": self.rope_theta,
            "quantization": self.quantization.as_config() if self.quantization else None,
            "eos_token_ids": list(self.eos_token_ids),
            "num_shards": self.num_shards,
        } | (
            ({"float_dtype": self.float_dtype} if self.float_dtype != "float32" else {})
            | ({"rope_scaling": self.rope_scaling_config()} if self.rope_scaling else {})
            | ({"max_position_embeddings": self.max_positions} if self.max_positions else {})
        )
