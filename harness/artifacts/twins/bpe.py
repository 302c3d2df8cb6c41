"""A real byte-level BPE tokenizer laid out over a large model vocabulary.

The twin's tokenizer has to be a genuine `tokenizers` BPE (so transformers, mlx-lm and
the in-tree ChatTokenizer all run real merges on it), fill every id below the model's
vocabulary size (an id the embedding has but the tokenizer lacks breaks decoding of a
random model's output), and keep the artifact's special ids exactly.

How: train merges with `tokenizers`' BpeTrainer on a fixed corpus (deterministic: the
trainer breaks count ties by the pair itself), then lay the vocabulary out ourselves:
special tokens at their fixed ids, the 256 byte symbols and the merged tokens from
`first_bpe_id` on in the trainer's order, and every other id a placeholder
`<|reserved_N|>` (N = its id). Placeholders are plain BPE vocabulary entries that no
merge produces, so encoding never emits them, decoding one gives its own text, and
loading stays fast. (130k added special tokens instead would make every loader build
a 130k-pattern matcher and put them all in tokenizer_config.json.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors, trainers

from harness.artifacts.convert.gguf_tokenizer import byte_level_bpe

PLACEHOLDER = "<|reserved_{}|>"


@dataclass(frozen=True)
class SpecialToken:
    """A token pinned to an id and registered as an added special token (never split, never merged)."""

    content: str
    token_id: int


def _byte_level_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    # GPT-2's split regex then bytes -> printable symbols; no prefix space, as in
    # Llama-3-style byte-level tokenizers.
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def train_merges(corpus: list[str], bpe_vocab_size: int) -> tuple[list[str], list[tuple[str, str]]]:
    """The trainer's tokens (byte alphabet, then one per merge, in id order) and its merges."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = _byte_level_pre_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab_size,
        # The corpus is small: let every pair that occurs become a merge (the most
        # frequent still come first), or the vocabulary would stop at a few hundred.
        min_frequency=1,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    merges = [tuple(pair) for pair in json.loads(tokenizer.to_str())["model"]["merges"]]
    return tokens, merges


def build_tokenizer(
    corpus: list[str],
    bpe_vocab_size: int,
    vocab_size: int,
    specials: list[SpecialToken],
    first_bpe_id: int,
) -> Tokenizer:
    """Train on `corpus`, then lay out exactly `vocab_size` ids as the module docstring says."""
    bpe_tokens, merges = train_merges(corpus, bpe_vocab_size)
    by_id: dict[int, str] = {}
    for token in specials:
        if not 0 <= token.token_id < vocab_size or token.token_id in by_id:
            raise ValueError(f"special token {token.content!r}: id {token.token_id} is taken or out of range")
        by_id[token.token_id] = token.content
    next_id = first_bpe_id
    for content in bpe_tokens:
        while next_id in by_id:
            next_id += 1
        by_id[next_id] = content
        next_id += 1
    if next_id > vocab_size:
        raise ValueError(f"{len(bpe_tokens)} BPE tokens do not fit below id {vocab_size}")
    for token_id in range(vocab_size):
        by_id.setdefault(token_id, PLACEHOLDER.format(token_id))
    vocab = {content: token_id for token_id, content in by_id.items()}
    if len(vocab) != vocab_size:
        raise ValueError("the vocabulary layout has duplicate tokens (a placeholder clashes with a real one)")

    tokenizer = byte_level_bpe(dict(sorted(vocab.items(), key=lambda kv: kv[1])), merges)
    tokenizer.pre_tokenizer = _byte_level_pre_tokenizer()
    # No BOS from the post-processor: the chat template writes bos_token itself.
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens(
        [AddedToken(t.content, special=True, normalized=False) for t in sorted(specials, key=lambda t: t.token_id)]
    )
    for token in specials:
        if tokenizer.token_to_id(token.content) != token.token_id:
            raise AssertionError(f"{token.content!r} moved from id {token.token_id}")
    return tokenizer


def live_id_ranges(tokenizer: Tokenizer, vocab_size: int) -> tuple[tuple[int, int], ...]:
    """The [start, stop) runs of ids that are real tokens, not `<|reserved_N|>` placeholders."""
    ranges: list[tuple[int, int]] = []
    for token_id in range(vocab_size):
        if tokenizer.id_to_token(token_id) == PLACEHOLDER.format(token_id):
            continue
        if ranges and ranges[-1][1] == token_id:
            ranges[-1] = (ranges[-1][0], token_id + 1)
        else:
            ranges.append((token_id, token_id + 1))
    return tuple(ranges)
