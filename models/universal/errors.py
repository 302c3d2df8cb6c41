"""The errors the universal Llama raises, so callers can tell a bad input from a bug."""


class ConfigError(ValueError):
    """config.json (or its quantization section) is missing a key or holds a bad value."""


class WeightLoadError(ValueError):
    """The safetensors do not match the module tree the config describes."""


class TokenizerError(ValueError):
    """The tokenizer files are missing, malformed or of a kind we cannot reproduce."""
