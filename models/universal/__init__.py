"""The universal Llama: an in-tree MLX implementation, bit-exact with mlx-lm's Llama.

Public surface: `load_model` (directory -> model, config), `ChatTokenizer` (encode,
decode, render_chat, eos_token_ids), `greedy_steps` (the decode loop) and the types
and errors they use. It imports only mlx, numpy, tokenizers, jinja2 and the stdlib.
"""

from models.universal.cache import KVCache
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
    "Step",
    "TokenizerError",
    "UniversalLlama",
    "WeightLoadError",
    "greedy_steps",
    "load_model",
]
