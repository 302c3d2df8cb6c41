"""The tokenizer of a llama GGUF (`tokenizer.ggml.*` metadata) as a Hugging Face `tokenizers`
tokenizer: vocabulary, merges, pre-tokenizer, post-processor and the special tokens' facts.
An unknown pre-tokenizer or token type is a ValueError naming it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    processors,
)

from harness.artifacts.convert.gguf_meta import optional, require

# llama.cpp token types (gguf.TokenType).
_TOKEN_NORMAL = 1


_TOKEN_CONTROL = 3


_TOKEN_USER_DEFINED = 4


@dataclass(frozen=True)
class TokenizerFacts:
    """What the HF side files need besides tokenizer.json itself."""

    tokens: list[str]
    special_ids: dict[str, int]  # "bos"/"eos"/"unk"/"pad" -> id, where the GGUF has one
    added_tokens: list[tuple[int, AddedToken]]
    add_bos: bool
    add_eos: bool


def _smollm_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    # HF SmolLM2's own tokenizer.json: each digit alone, then GPT-2's regex + bytes.
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )


# `tokenizer.ggml.pre` -> the HF pre-tokenizer it stands for. Add entries only with a
# check against the model's real tokenizer.json: a near miss changes token ids.
_PRE_TOKENIZERS = {"smollm": _smollm_pre_tokenizer}


def build_tokenizer(meta: dict[str, Any]) -> tuple[Tokenizer, TokenizerFacts]:
    """A `tokenizers` Tokenizer equivalent to the GGUF's gpt2-style BPE."""
    model_kind = require(meta, "tokenizer.ggml.model")
    if model_kind != "gpt2":
        raise ValueError(f"unsupported GGUF tokenizer model {model_kind!r} (only 'gpt2')")
    pre = optional(meta, "tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r}")
    if optional(meta, "tokenizer.ggml.add_space_prefix", False):
        raise ValueError("unsupported tokenizer.ggml.add_space_prefix = true")

    tokens: list[str] = list(require(meta, "tokenizer.ggml.tokens"))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError("GGUF vocabulary has duplicate tokens")
    merges: list[tuple[str, str]] = []
    for merge in require(meta, "tokenizer.ggml.merges"):
        left, sep, right = merge.partition(" ")
        if not sep or " " in right or not left or not right:
            raise ValueError(f"malformed GGUF merge {merge!r}")
        merges.append((left, right))
    types = list(optional(meta, "tokenizer.ggml.token_type", [_TOKEN_NORMAL] * len(tokens)))
    if len(types) != len(tokens):
        raise ValueError("tokenizer.ggml.token_type and tokens differ in length")

    added: list[tuple[int, AddedToken]] = []
    for i, (tok, kind) in enumerate(zip(tokens, types, strict=True)):
        if kind == _TOKEN_NORMAL:
            continue
        if kind not in (_TOKEN_CONTROL, _TOKEN_USER_DEFINED):
            raise ValueError(f"unsupported token type {kind} for token {i} {tok!r}")
        special = kind == _TOKEN_CONTROL
        added.append((i, AddedToken(tok, special=special, normalized=False)))

    special_ids: dict[str, int] = {}
    for role, key in (
        ("bos", "bos_token_id"),
        ("eos", "eos_token_id"),
        ("unk", "unknown_token_id"),
        ("pad", "padding_token_id"),
    ):
        token_id = optional(meta, f"tokenizer.ggml.{key}")
        if token_id is not None:
            if not 0 <= int(token_id) < len(tokens):
                raise ValueError(f"tokenizer.ggml.{key} {token_id} outside the vocabulary")
            special_ids[role] = int(token_id)
    add_bos = bool(optional(meta, "tokenizer.ggml.add_bos_token", False))
    add_eos = bool(optional(meta, "tokenizer.ggml.add_eos_token", False))

    # gpt2 BPE has no unknown token: bytes missing from the vocab are dropped, as in
    # the HF original (model.unk_token null). unk_token only lives in tokenizer_config.
    tokenizer = byte_level_bpe(vocab, merges)
    tokenizer.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    tokenizer.post_processor = _post_processor(tokens, special_ids, add_bos, add_eos)
    # Tokens are already in the vocabulary, so they keep their ids.
    tokenizer.add_tokens([tok for _, tok in added if not tok.special])
    tokenizer.add_special_tokens([tok for _, tok in added if tok.special])
    for i, tok in added:
        if tokenizer.token_to_id(tok.content) != i:
            raise AssertionError(f"added token {tok.content!r} moved from id {i}")

    facts = TokenizerFacts(tokens, special_ids, added, add_bos, add_eos)
    return tokenizer, facts


def _post_processor(
    tokens: list[str], special_ids: dict[str, int], add_bos: bool, add_eos: bool
) -> processors.PostProcessor:
    """ByteLevel offsets as in HF's gpt2-style files, plus BOS/EOS when the GGUF asks."""
    byte_level = processors.ByteLevel(trim_offsets=False)
    if not (add_bos or add_eos):
        return byte_level
    ends: dict[str, tuple[str, int] | None] = {}
    for role, wanted in (("bos", add_bos), ("eos", add_eos)):
        if wanted and role not in special_ids:
            raise ValueError(f"GGUF asks to add {role} but has no {role} id")
        ends[role] = (tokens[special_ids[role]], special_ids[role]) if wanted else None

    def segment(seq: str, type_id: int) -> list[str]:
        head = [f"{ends['bos'][0]}:{type_id}"] if ends["bos"] else []
        tail = [f"{ends['eos'][0]}:{type_id}"] if ends["eos"] else []
        return [*head, f"${seq}:{type_id}", *tail]

    template = processors.TemplateProcessing(
        single=segment("A", 0),
        pair=segment("A", 0) + segment("B", 1),
        special_tokens=sorted({end for end in ends.values() if end is not None}),
    )
    return processors.Sequence([byte_level, template])


def byte_level_bpe(vocab: dict[str, int], merges: list[tuple[str, str]]) -> Tokenizer:
    """A GPT-2 style byte-level BPE over this vocabulary and these merges: no unknown token,
    no byte fallback, merges always applied; its decoder is byte-level (the pre-tokenizer is
    the caller's)."""
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=False,
        )
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer
