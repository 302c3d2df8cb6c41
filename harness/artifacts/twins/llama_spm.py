"""Tiny Llama twins with SentencePiece-style tokenizers: the streams the byte-level twins never gate.

Design notes: docs/twins.md ("SentencePiece Llama twins"). Three twins share one shape, one seed
(so the same weights) and one trained vocabulary; only tokenizer.json (and tokenizer_config.json)
differ, each in the `decoder` shape that makes mlx-lm 0.32.2's tokenizer_utils.load pick another
streaming detokenizer (and `stream_kind` in models/universal/detokenize.py another stream):

- `llama-spm-mini`: Llama 2 / Mistral v0.1 as shipped: BPE with byte_fallback, Metaspace
  pre-tokenizer (prepend "first", no split), decoder Sequence[Replace("▁", " "), ByteFallback,
  Fuse, Strip(" ", 1, 0)], tokenizer_class LlamaTokenizer -> SPMStreamingDetokenizer (trim_space)
  / SentencePieceStream(trim_first_space=True).
- `llama-spm-keep-space-mini`: the same BPE as Gemma ships its tokenizer: normalizer
  Replace(" ", "▁"), no dummy prefix, decoder Sequence[Replace, ByteFallback, Fuse] (no Strip)
  -> SPMStreamingDetokenizer(trim_space=False) / SentencePieceStream(trim_first_space=False).
- `llama-unigram-mini`: a Unigram model with byte_fallback over the same pieces, as transformers'
  SpmConverter writes a Unigram SentencePiece (Metaspace pre-tokenizer, a Metaspace decoder, here
  after the ByteFallback step a byte-fallback model needs), clean_up_tokenization_spaces true ->
  NaiveStreamingDetokenizer / DecodeStream (the tokenizer's own decode, with its " ," cleanup).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from harness.artifacts.twins.spec import LlamaShape, TwinSpec
from harness.artifacts.twins.weights import write_weights
from harness.paths import REPO_ROOT

SPACE = "\u2581"
UNK, BOS, EOS = "<unk>", "<s>", "</s>"
SPECIALS = (UNK, BOS, EOS)  # ids 0, 1, 2, as Llama 2 numbers them
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))  # ids 3..258, as Llama 2 numbers them
FIRST_TRAINED_ID = len(SPECIALS) + len(BYTE_TOKENS)
VOCAB_SIZE = 2048
MAX_POSITIONS = 4096
RMS_NORM_EPS = 1e-05
ROPE_THETA = 10000.0

# The training text: fixtures/corpus/kjv-genesis-1-12.txt, pinned here by its sha256 (its README
# records the same): an edit would change every merge, so it is refused, not silently followed.
CORPUS_FILE = REPO_ROOT / "fixtures" / "corpus" / "kjv-genesis-1-12.txt"
CORPUS_SHA256 = "cf76787c626e9ba2a9fbe6cb0dc5ee93d00660a9715c77c44fb34b58584612ee"
# Every printable ASCII character is a piece whatever the corpus holds (SentencePiece's character
# coverage, as Llama 2 has them): only other characters fall back to <0xNN> bytes.
ALPHABET = [SPACE, *(chr(c) for c in range(0x21, 0x7F))]

# A Mistral-Instruct-style chat template (user / assistant turns, [INST] markers), kept in
# tokenizer_config.json as Llama 2 and Mistral v0.1 ship theirs.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
    "{% endfor %}"
)

FLAVORS = ("llama", "keep-space", "unigram")


def training_text() -> list[str]:
    """The corpus's chapters, newlines made spaces (SentencePiece's pieces hold no newline: a
    newline is the byte token <0x0A>, as in Llama 2)."""
    data = CORPUS_FILE.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != CORPUS_SHA256:
        raise ValueError(f"{CORPUS_FILE}: sha256 {digest}, the twins are trained on {CORPUS_SHA256}")
    return [chapter.replace("\n", " ") for chapter in data.decode("utf-8").split("\n\n")]


def _training_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    # Words with their "▁" (SentencePiece's split_by_whitespace): no piece spans a word boundary.
    return pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)


@lru_cache(maxsize=1)
def train() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The trainer's pieces (alphabet, then one per merge, in id order) and its merges.

    Deterministic: BpeTrainer breaks count ties by the pair itself."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = _training_pre_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - FIRST_TRAINED_ID,
        min_frequency=1,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=ALPHABET,
    )
    tokenizer.train_from_iterator(training_text(), trainer=trainer)
    vocab = tokenizer.get_vocab()
    if len(vocab) != VOCAB_SIZE - FIRST_TRAINED_ID:
        raise ValueError(f"the corpus gave {len(vocab)} pieces, the layout needs {VOCAB_SIZE - FIRST_TRAINED_ID}")
    pieces = tuple(sorted(vocab, key=vocab.__getitem__))
    merges = tuple(tuple(pair) for pair in json.loads(tokenizer.to_str())["model"]["merges"])
    return pieces, merges  # type: ignore[return-value]


def vocabulary() -> dict[str, int]:
    """Specials at 0-2, the 256 byte tokens at 3-258, the trained pieces from 259 (Llama 2's layout)."""
    pieces, _ = train()
    ordered = [*SPECIALS, *BYTE_TOKENS, *pieces]
    vocab = {piece: i for i, piece in enumerate(ordered)}
    if len(vocab) != VOCAB_SIZE:
        raise ValueError("the vocabulary layout has duplicate pieces")
    return vocab


def _bpe(vocab: dict[str, int]) -> models.Model:
    _, merges = train()
    return models.BPE(vocab=vocab, merges=list(merges), unk_token=UNK, fuse_unk=True, byte_fallback=True)


def unigram_scores(vocab: dict[str, int]) -> list[tuple[str, float]]:
    """Unigram pieces in id order with scores: the log relative frequency of each trained piece in
    the BPE segmentation of the corpus (one Viterbi-count step from the BPE vocabulary; the
    Unigram trainer itself is not deterministic across runs). Pieces the segmentation never uses
    get the lowest observed score minus one; specials and byte tokens 0.0 (SentencePiece's)."""
    tokenizer = Tokenizer(_bpe(vocab))
    tokenizer.pre_tokenizer = _training_pre_tokenizer()
    counts: Counter[int] = Counter()
    for chapter in training_text():
        counts.update(tokenizer.encode(chapter, add_special_tokens=False).ids)
    total = sum(counts.values())
    logp = {i: math.log(n / total) for i, n in counts.items()}
    floor = min(logp.values()) - 1.0
    out = []
    for piece, i in sorted(vocab.items(), key=lambda kv: kv[1]):
        out.append((piece, 0.0 if i < FIRST_TRAINED_ID else round(logp.get(i, floor), 6)))
    return out


def _post_processor() -> processors.PostProcessor:
    # Llama 2's: BOS before every sequence, no EOS.
    return processors.TemplateProcessing(
        single=f"{BOS}:0 $A:0", pair=f"{BOS}:0 $A:0 {BOS}:1 $B:1", special_tokens=[(BOS, SPECIALS.index(BOS))]
    )


def build_tokenizer(flavor: str) -> Tokenizer:
    """tokenizer.json of one flavor (module docstring)."""
    vocab = vocabulary()
    if flavor == "unigram":
        tokenizer = Tokenizer(models.Unigram(unigram_scores(vocab), unk_id=SPECIALS.index(UNK), byte_fallback=True))
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)
        tokenizer.decoder = decoders.Sequence(
            [decoders.ByteFallback(), decoders.Metaspace(replacement=SPACE, prepend_scheme="always", split=True)]
        )
    elif flavor in ("llama", "keep-space"):
        tokenizer = Tokenizer(_bpe(vocab))
        steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
        if flavor == "llama":  # transformers' LlamaConverter, legacy=False
            tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first", split=False)
            steps.append(decoders.Strip(content=" ", left=1, right=0))
        else:  # transformers' GemmaConverter: spaces replaced, no dummy prefix
            tokenizer.normalizer = normalizers.Replace(" ", SPACE)
        tokenizer.decoder = decoders.Sequence(steps)
    else:
        raise ValueError(f"unknown tokenizer flavor {flavor!r}; known: {', '.join(FLAVORS)}")
    tokenizer.post_processor = _post_processor()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    for i, token in enumerate(SPECIALS):
        if tokenizer.token_to_id(token) != i:
            raise AssertionError(f"{token!r} moved from id {i}")
    if tokenizer.get_vocab_size(with_added_tokens=True) != VOCAB_SIZE:
        raise AssertionError("the tokenizer's size is not the model's vocabulary")
    return tokenizer


def _token_dict(content: str) -> dict[str, Any]:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def tokenizer_config(flavor: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {str(i): {**_token_dict(t), "special": True} for i, t in enumerate(SPECIALS)},
        "bos_token": BOS,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": flavor == "unigram",
        "eos_token": EOS,
        "model_max_length": MAX_POSITIONS,
        "pad_token": None,
        "unk_token": UNK,
    }
    if flavor == "llama":  # transformers rebuilds the pipeline (the in-tree ChatTokenizer replays it)
        config |= {"legacy": False, "tokenizer_class": "LlamaTokenizer"}
    else:  # tokenizer.json as written
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    return dict(sorted(config.items()))


def model_config(spec: TwinSpec) -> dict[str, Any]:
    """config.json as Llama 2's, at the twin's dimensions, float32."""
    shape = spec.shape
    config = {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "bos_token_id": SPECIALS.index(BOS),
        "eos_token_id": SPECIALS.index(EOS),
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "max_position_embeddings": spec.max_positions or MAX_POSITIONS,
        "model_type": "llama",
        "num_attention_heads": shape.num_attention_heads,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_key_value_heads": shape.num_key_value_heads,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_scaling": spec.rope_scaling_config(),
        "rope_theta": spec.rope_theta,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "torch_dtype": spec.float_dtype,
        "use_cache": True,
        "vocab_size": shape.vocab_size,
    }
    return dict(sorted(config.items()))


def _write_json(path: Path, obj: Any, indent: int = 2) -> None:
    path.write_text(json.dumps(obj, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")


def _writer(flavor: str):
    def write(spec: TwinSpec, out_dir: Path) -> None:
        tokenizer = build_tokenizer(flavor)
        write_weights(out_dir, spec.shape, spec.seed, spec.quantization, spec.num_shards, None, spec.float_dtype)
        _write_json(out_dir / "config.json", model_config(spec))
        tokenizer.save(str(out_dir / "tokenizer.json"))
        _write_json(out_dir / "tokenizer_config.json", tokenizer_config(flavor))
        _write_json(
            out_dir / "special_tokens_map.json",
            {"bos_token": _token_dict(BOS), "eos_token": _token_dict(EOS), "unk_token": _token_dict(UNK)},
        )
        _write_json(
            out_dir / "generation_config.json",
            {"bos_token_id": SPECIALS.index(BOS), "eos_token_id": SPECIALS.index(EOS)},
        )

    return write


LLAMA_SPM_MINI_SHAPE = LlamaShape(
    num_hidden_layers=2,
    hidden_size=128,
    intermediate_size=384,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    vocab_size=VOCAB_SIZE,
)
SEED = 70_001


def _spec(twin_id: str, flavor: str, description: str) -> TwinSpec:
    return TwinSpec(
        twin_id=twin_id,
        description=description,
        seed=SEED,
        shape=LLAMA_SPM_MINI_SHAPE,
        quantization=None,
        num_shards=1,
        rope_theta=ROPE_THETA,
        eos_token_ids=(SPECIALS.index(EOS),),
        write=_writer(flavor),
    )


LLAMA_SPM_MINI = _spec(
    "llama-spm-mini",
    "llama",
    "a 2-layer float32 Llama with Llama 2's tokenizer.json shape (byte-fallback BPE, Metaspace, "
    "decoder Replace/ByteFallback/Fuse/Strip): mlx-lm's SPM detokenizer, trimming the first space",
)
LLAMA_SPM_KEEP_SPACE_MINI = _spec(
    "llama-spm-keep-space-mini",
    "keep-space",
    "llama-spm-mini's weights and pieces with Gemma's tokenizer.json shape (decoder "
    "Replace/ByteFallback/Fuse, no Strip): mlx-lm's SPM detokenizer keeping the first space",
)
LLAMA_UNIGRAM_MINI = _spec(
    "llama-unigram-mini",
    "unigram",
    "llama-spm-mini's weights and pieces as a byte-fallback Unigram with a Metaspace decoder and "
    "clean_up_tokenization_spaces: mlx-lm's naive (decode-based) detokenizer",
)
LLAMA_SPM_TWINS = (LLAMA_SPM_MINI, LLAMA_SPM_KEEP_SPACE_MINI, LLAMA_UNIGRAM_MINI)
