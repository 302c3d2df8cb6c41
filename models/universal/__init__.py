"""The universal Llama: an in-tree MLX implementation, bit-exact with mlx-lm's Llama.

Public surface: `load_model` (directory -> model, config), `ChatTokenizer` (encode,
decode, render_chat, render_chat_like_mlx_lm, has_thinking, eos_token_ids), `greedy_steps`
(the decode loop, with mlx-lm's forced-prefix, KV-quantization and rotating-cache options),
the caches and the types and errors they use. It imports only mlx, numpy, tokenizers,
jinja2 and the stdlib.
"""

from models.universal.cache import KVCache, QuantizedKVCache, RotatingKVCache
from models.universal.config import LlamaConfig, QuantizationConfig, QuantSpec
from models.universal.errors import ConfigError, TokenizerError, WeightLoadError
from models.universal.generate import Step, greedy_steps
from models.universal.loader import load_model
from models.universal.model import UniversalLlama
from models.universal.tokenizer import ChatTokenizer

__all__ = [
    "ChatTokenizer",
    "ConfigError",
    "KVCache",
    "LlamaConfig",
    "QuantSpec",
    "QuantizationConfig",
    "QuantizedKVCache",
    "RotatingKVCache",
    "Step",
    "TokenizerError",
    "UniversalLlama",
    "WeightLoadError",
    "greedy_steps",
    "load_model",
]
