"""detect_family: which model family a config.json describes, by exact shape only.

Families decide defaults (a thinking default, a dedicated graph, cache assumptions), so
a near miss must not inherit them: the design notes record that the older MiniCPM5
predicate matches only the 24-layer, hidden-1536 artifact and that the 2B shape falls
through to the generic Llama. Each predicate is therefore an exact match on the numbers
we can state for that artifact, and a config with any one of them changed is plain
"llama". Never widen a predicate to "close enough".
"""

from __future__ import annotations

from typing import Any

MINICPM5_2B = "minicpm5-2b"
MINICPM5_1B = "minicpm5-1b"
LLAMA = "llama"
UNSUPPORTED = "unsupported"

# openbmb/MiniCPM5-2B-MLX@3d00c3da: every field that fixes a tensor shape.
_MINICPM5_2B_SHAPE = {
    "num_hidden_layers": 42,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "vocab_size": 130560,
}
# The older MiniCPM5 (1B): only the two numbers we know for certain.
_MINICPM5_1B_SHAPE = {"num_hidden_layers": 24, "hidden_size": 1536}

# Keys that mark a mixture-of-experts config: not a dense Llama.
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def _effective(config: dict[str, Any], key: str) -> Any:
    """The value a Llama loader uses: head_dim and KV heads have mlx-lm's defaults."""
    if key == "head_dim":
        heads = config.get("num_attention_heads")
        hidden = config.get("hidden_size")
        derived = hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None
        return config.get("head_dim") or derived
    if key == "num_key_value_heads":
        return config.get("num_key_value_heads") or config.get("num_attention_heads")
    return config.get(key)


def _matches(config: dict[str, Any], shape: dict[str, int]) -> bool:
    # `type(...) is int` so that True (== 1) or 42.0 never pass for an integer field.
    return all(type(_effective(config, k)) is int and _effective(config, k) == v for k, v in shape.items())


def detect_family(config: dict[str, Any]) -> str:
    """The family name: minicpm5-2b, minicpm5-1b, llama (any other dense Llama) or unsupported."""
    if not isinstance(config, dict) or config.get("model_type") != "llama":
        return UNSUPPORTED
    if any(config.get(key) for key in _EXPERT_KEYS):
        return UNSUPPORTED
    if _matches(config, _MINICPM5_2B_SHAPE):
        return MINICPM5_2B
    if _matches(config, _MINICPM5_1B_SHAPE):
        return MINICPM5_1B
    return LLAMA
