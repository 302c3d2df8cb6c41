"""The universal Llama: an in-tree MLX implementation, bit-exact with mlx-lm's Llama.

Public surface: `load_model` (directory -> model, config), `ChatTokenizer` (encode,
decode, render_chat, render_chat_like_mlx_lm, has_thinking, eos_token_ids), `greedy_steps`
(the decode loop, with mlx-lm's forced-prefix, KV-quantization and rotating-cache options,
and a cache the caller may keep), `chat_turn_steps` (turns decoded on one kept cache, as
mlx_lm.chat does), `batch_greedy_steps` (prompts decoded together, as mlx-lm's
BatchGenerator does), the caches and the types and errors they use. It imports only mlx, numpy, tokenizers,
jinja2 and the stdlib.
"""

from models.universal.batch import batch_greedy_steps
from models.universal.cache import BatchKVCache, KVCache
from models.universal.config import LlamaConfig, QuantizationConfig, QuantSpec
from models.universal.errors import ConfigError, TokenizerError, WeightLoadError
from models.universal.generate import Step, chat_turn_steps, greedy_steps
from models.universal.loader import load_model
from models.universal.model import UniversalLlama
from models.universal.quantized_cache import QuantizedKVCache
from models.universal.rotating_cache import RotatingKVCache
from models.universal.tokenizer import ChatTokenizer

__all__ = [
    "BatchKVCache",
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
    "batch_greedy_steps",
    "chat_turn_steps",
    "greedy_steps",
    "load_model",
]
