"""Which tokenizer class transformers' AutoTokenizer builds for a Llama model directory, and how
a rebuilding class rebuilds tokenizer.json's pipeline.

`_backend_kind` names the class's scheme: "file" (tokenizer.json as written), "gpt2"
(GPT2Tokenizer: byte-level BPE, keeping only the vocab/merges and the post-processor) or
"llama" (a non-ByteLevel LlamaTokenizer: SentencePiece-style BPE behind its own Metaspace
pipeline, with byte fallback). `_build_backend` builds the `tokenizers` backend of that scheme.
A class not replayed here is a TokenizerError rather than a silent guess.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE

from models.universal.errors import TokenizerError

# tokenizer_class values (without "Fast") that load tokenizer.json unchanged.
_FILE_AS_IS_CLASSES = frozenset(
    {"PreTrainedTokenizer", "PreTrainedTokenizerFast", "TokenizersBackend", "BloomTokenizer"}
)
# Model types AutoTokenizer maps to the generic backend whatever tokenizer_class says
# (mistral: when mistral_common is not installed, as in the oracle venv).
_GENERIC_BACKEND_MODEL_TYPES = frozenset({"mistral", "iquestcoder"})


def _backend_kind(settings: dict[str, Any], model_config: dict[str, Any], tokenizer_json: str) -> str:
    """Which transformers class AutoTokenizer would build for a Llama directory."""
    if model_config.get("model_type") in _GENERIC_BACKEND_MODEL_TYPES:
        return "file"
    declared = settings.get("tokenizer_class") or model_config.get("tokenizer_class")
    if declared is None:
        return "file"
    name = declared.removesuffix("Fast")
    if name in _FILE_AS_IS_CLASSES:
        return "file"
    if name == "LlamaTokenizer":
        # AutoTokenizer routes a ByteLevel tokenizer.json (Llama 3 style) to the generic
        # backend; only the sentencepiece-style one gets the LlamaTokenizer rebuild.
        return "file" if '"ByteLevel"' in tokenizer_json else "llama"
    if name == "GPT2Tokenizer":
        return "gpt2"
    raise TokenizerError(
        f"tokenizer_class {declared!r}: transformers may rebuild this tokenizer in ways "
        "not reproduced here (supported: PreTrainedTokenizerFast, LlamaTokenizer, GPT2Tokenizer)"
    )


def _build_backend(
    kind: str, tokenizer_file: Path, tokenizer_json: dict[str, Any], settings: dict[str, Any]
) -> Tokenizer:
    if kind == "file":
        return Tokenizer.from_file(str(tokenizer_file))
    model = tokenizer_json.get("model", {})
    if model.get("type") != "BPE":
        raise TokenizerError(f"{kind} tokenizer expects a BPE tokenizer.json model")
    vocab = model["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    if kind == "gpt2":
        backend = Tokenizer(
            BPE(
                vocab=vocab,
                merges=merges,
                dropout=None,
                continuing_subword_prefix="",
                end_of_word_suffix="",
                fuse_unk=False,
            )
        )
        add_prefix_space = bool(settings.get("add_prefix_space", False))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
        backend.decoder = decoders.ByteLevel()
    else:
        backend = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None))
        add_prefix_space = settings.get("add_prefix_space")
        add_prefix_space = True if add_prefix_space is None else add_prefix_space
        legacy = settings.get("legacy", False)
        prepend = ("first" if not legacy else "always") if add_prefix_space else "never"
        backend.normalizer = None
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend, split=False)
        steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        if add_prefix_space:
            steps.append(decoders.Strip(content=" ", left=1))
        backend.decoder = decoders.Sequence(steps)
    # The rebuilt pipeline keeps tokenizer.json's post-processor.
    if tokenizer_json.get("post_processor"):
        original = Tokenizer.from_file(str(tokenizer_file))
        backend.post_processor = original.post_processor
    return backend
