"""Whisper's tokenizer: byte-level BPE (tiktoken) plus Whisper's special tokens.

Ids equal mlx-whisper 0.4.3's `get_tokenizer` ids. The byte-pair ranks come from the
model directory, in the first of these forms found there:

- a `*.tiktoken` file (base64 token, rank per line), as mlx-whisper ships
  `gpt2.tiktoken` / `multilingual.tiktoken`;
- CTranslate2's `vocabulary.txt` (one GPT-2 byte-level string per id; the lines before
  `<|endoftext|>` are the ranks, id for id the gpt2.tiktoken layout);
- a Hugging Face `tokenizer.json` (its BPE `model.vocab`, same byte-level strings).

Special tokens are not read from those files (CTranslate2 names id 50361
`<|nocaptions|>`, mlx-whisper `<|nospeech|>`): they are appended after the ranks in
mlx-whisper's order — `<|endoftext|>`, `<|startoftranscript|>`, one `<|xx|>` per
language (the first `num_languages` of LANGUAGES), `<|translate|>`, `<|transcribe|>`,
`<|startoflm|>`, `<|startofprev|>`, `<|nospeech|>`, `<|notimestamps|>`, then the 1501
timestamps `<|0.00|>` … `<|30.00|>`.
"""

from __future__ import annotations

import base64
import json
import string
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path

import tiktoken

# The GPT-2 pre-tokenizer pattern every Whisper vocabulary uses.
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# Whisper's language codes in token order (the order decides the language token ids).
_LANGUAGE_TABLE = """
en:english zh:chinese de:german es:spanish ru:russian ko:korean fr:french ja:japanese
pt:portuguese tr:turkish pl:polish ca:catalan nl:dutch ar:arabic sv:swedish it:italian
id:indonesian hi:hindi fi:finnish vi:vietnamese he:hebrew uk:ukrainian el:greek ms:malay
cs:czech ro:romanian da:danish hu:hungarian ta:tamil no:norwegian th:thai ur:urdu
hr:croatian bg:bulgarian lt:lithuanian la:latin mi:maori ml:malayalam cy:welsh sk:slovak
te:telugu fa:persian lv:latvian bn:bengali sr:serbian az:azerbaijani sl:slovenian
kn:kannada et:estonian mk:macedonian br:breton eu:basque is:icelandic hy:armenian
ne:nepali mn:mongolian bs:bosnian kk:kazakh sq:albanian sw:swahili gl:galician mr:marathi
pa:punjabi si:sinhala km:khmer sn:shona yo:yoruba so:somali af:afrikaans oc:occitan
ka:georgian be:belarusian tg:tajik sd:sindhi gu:gujarati am:amharic yi:yiddish lo:lao
uz:uzbek fo:faroese ht:haitian_creole ps:pashto tk:turkmen nn:nynorsk mt:maltese
sa:sanskrit lb:luxembourgish my:myanmar bo:tibetan tl:tagalog mg:malagasy as:assamese
tt:tatar haw:hawaiian ln:lingala ha:hausa ba:bashkir jw:javanese su:sundanese yue:cantonese
"""
LANGUAGES: dict[str, str] = {
    code: name.replace("_", " ") for code, name in (item.split(":") for item in _LANGUAGE_TABLE.split())
}
_LANGUAGE_ALIASES = {
    "burmese": "my",
    "valencian": "ca",
    "flemish": "nl",
    "haitian": "ht",
    "letzeburgesch": "lb",
    "pushto": "ps",
    "panjabi": "pa",
    "moldavian": "ro",
    "moldovan": "ro",
    "sinhalese": "si",
    "castilian": "es",
    "mandarin": "zh",
}
TO_LANGUAGE_CODE: dict[str, str] = {**{name: code for code, name in LANGUAGES.items()}, **_LANGUAGE_ALIASES}

N_TIMESTAMPS = 1501  # <|0.00|> … <|30.00|> in 0.02 s steps
_TASK_TOKENS = (
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nospeech|>",
    "<|notimestamps|>",
)

# Symbols whose tokens a speech transcript should not start a word with (speaker tags,
# sound annotations, music notes). Basic punctuation stays allowed.
_NON_SPEECH_SYMBOLS = [
    *'"#()*+/:;<=>@[\\]^_`{|}~「」『』',
    *"<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split(),
]
# U+2640..U+267F symbols: when one is several tokens, its first token (shared by the whole
# block's 3-byte UTF-8 prefix) is suppressed.
_MUSIC_SYMBOLS = "♩♪♫♬♭♮♯"


def special_token_names(num_languages: int) -> list[str]:
    """Whisper's special tokens in id order, as mlx-whisper appends them after the ranks."""
    languages = [f"<|{code}|>" for code in list(LANGUAGES)[:num_languages]]
    timestamps = [f"<|{i * 0.02:.2f}|>" for i in range(N_TIMESTAMPS)]
    return ["<|endoftext|>", "<|startoftranscript|>", *languages, *_TASK_TOKENS, *timestamps]


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in character for each byte, inverted (char -> byte)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars: dict[int, int] = {b: b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + shifted
            shifted += 1
    return {chr(c): b for b, c in chars.items()}


def _byte_level_to_bytes(token: str) -> bytes:
    table = _byte_level_decoder()
    try:
        return bytes(table[ch] for ch in token)
    except KeyError as exc:
        raise ValueError(f"token {token!r} is not a GPT-2 byte-level string") from exc


def _ranks_from_tiktoken(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _ranks_from_vocabulary_txt(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for rank, line in enumerate(path.read_text(encoding="utf-8").split("\n")):
        if line == "<|endoftext|>":
            return ranks
        ranks[_byte_level_to_bytes(line)] = rank
    raise ValueError(f"{path}: no <|endoftext|> line ends the byte-pair ranks")


def _ranks_from_tokenizer_json(path: Path) -> dict[bytes, int]:
    vocab = json.loads(path.read_text(encoding="utf-8"))["model"]["vocab"]
    specials = {token for token in vocab if token.startswith("<|") and token.endswith("|>")}
    return {_byte_level_to_bytes(token): rank for token, rank in vocab.items() if token not in specials}


def read_ranks(model_dir: str | Path) -> dict[bytes, int]:
    """The byte-pair ranks of the vocabulary in `model_dir` (see the module docstring)."""
    model_dir = Path(model_dir)
    tiktoken_files = sorted(model_dir.glob("*.tiktoken"))
    if len(tiktoken_files) > 1:
        raise ValueError(f"{model_dir}: more than one .tiktoken vocabulary: {[p.name for p in tiktoken_files]}")
    if tiktoken_files:
        ranks = _ranks_from_tiktoken(tiktoken_files[0])
    elif (model_dir / "vocabulary.txt").is_file():
        ranks = _ranks_from_vocabulary_txt(model_dir / "vocabulary.txt")
    elif (model_dir / "tokenizer.json").is_file():
        ranks = _ranks_from_tokenizer_json(model_dir / "tokenizer.json")
    else:
        raise FileNotFoundError(f"{model_dir}: no *.tiktoken, vocabulary.txt or tokenizer.json")
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{model_dir}: byte-pair ranks are not 0..{len(ranks) - 1} without gaps")
    return ranks


def build_encoding(ranks: dict[bytes, int], num_languages: int, name: str = "whisper") -> tiktoken.Encoding:
    """A tiktoken encoding of `ranks` followed by Whisper's special tokens."""
    specials = {token: len(ranks) + i for i, token in enumerate(special_token_names(num_languages))}
    return tiktoken.Encoding(
        name=name,
        pat_str=PATTERN,
        mergeable_ranks=ranks,
        special_tokens=specials,
        explicit_n_vocab=len(ranks) + len(specials),
    )


@lru_cache(maxsize=8)
def _cached_encoding(model_dir: Path, num_languages: int) -> tiktoken.Encoding:
    return build_encoding(read_ranks(model_dir), num_languages, name=model_dir.name)


def load_encoding(model_dir: str | Path, num_languages: int, n_vocab: int | None = None) -> tiktoken.Encoding:
    """The encoding for the model in `model_dir`; `n_vocab`, when given, must equal its size."""
    encoding = _cached_encoding(Path(model_dir).resolve(), num_languages)
    if n_vocab is not None and encoding.n_vocab != n_vocab:
        raise ValueError(
            f"{model_dir}: vocabulary of {encoding.n_vocab} tokens ({num_languages} languages), the model has {n_vocab}"
        )
    return encoding


def _special_token(text: str) -> cached_property:
    """A Tokenizer property: the id of the special token `text` (looked up once)."""
    return cached_property(lambda self: self.special_tokens[text])


@dataclass
class Tokenizer:
    """tiktoken plus Whisper's special tokens and its start-of-transcript sequence."""

    encoding: tiktoken.Encoding
    num_languages: int
    language: str | None = None
    task: str | None = None
    special_tokens: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for token in self.encoding.special_tokens_set:
            self.special_tokens[token] = self.encoding.encode_single_token(token)

    @cached_property
    def sot_sequence(self) -> tuple[int, ...]:
        sequence = [self.sot]
        if self.language is not None:
            sequence.append(self.sot + 1 + list(LANGUAGES)[: self.num_languages].index(self.language))
        if self.task is not None:
            sequence.append(self.transcribe if self.task == "transcribe" else self.translate)
        return tuple(sequence)

    @cached_property
    def sot_sequence_including_notimestamps(self) -> tuple[int, ...]:
        return (*self.sot_sequence, self.no_timestamps)

    def encode(self, text: str, **kwargs) -> list[int]:
        return self.encoding.encode(text, **kwargs)

    def decode(self, token_ids: list[int], **kwargs) -> str:
        """Text of `token_ids`; timestamp tokens are dropped (other special tokens are not)."""
        return self.encoding.decode([t for t in token_ids if t < self.timestamp_begin], **kwargs)

    def decode_with_timestamps(self, token_ids: list[int], **kwargs) -> str:
        """Text of `token_ids` with timestamps written as `<|1.08|>`."""
        return self.encoding.decode(token_ids, **kwargs)

    @cached_property
    def eot(self) -> int:
        return self.encoding.eot_token

    sot = _special_token("<|startoftranscript|>")
    translate = _special_token("<|translate|>")
    transcribe = _special_token("<|transcribe|>")
    sot_lm = _special_token("<|startoflm|>")
    sot_prev = _special_token("<|startofprev|>")
    no_speech = _special_token("<|nospeech|>")
    no_timestamps = _special_token("<|notimestamps|>")
    timestamp_begin = _special_token("<|0.00|>")

    @cached_property
    def language_token(self) -> int:
        if self.language is None:
            raise ValueError("this tokenizer has no language set")
        return self.to_language_token(self.language)

    def to_language_token(self, language: str) -> int:
        token = self.special_tokens.get(f"<|{language}|>")
        if token is None:
            raise KeyError(f"language {language} is not in this vocabulary")
        return token

    @cached_property
    def all_language_tokens(self) -> tuple[int, ...]:
        """Language token ids in id order (mlx-whisper lists them in set order; only a tie
        between two languages' probabilities could tell the two apart)."""
        ids = sorted(i for token, i in self.special_tokens.items() if token.strip("<|>") in LANGUAGES)
        return tuple(ids[: self.num_languages])

    @cached_property
    def all_language_codes(self) -> tuple[str, ...]:
        return tuple(self.decode([t]).strip("<|>") for t in self.all_language_tokens)

    @cached_property
    def non_speech_tokens(self) -> tuple[int, ...]:
        """Tokens that start speaker tags or sound annotations, e.g. "♪♪♪", "( SPEAKING FOREIGN
        LANGUAGE )", "[DAVID] Hey": suppressed when `suppress_tokens` holds -1. " -" and " '"
        stay allowed inside words but not as a word's start."""
        result = {self.encoding.encode(" -")[0], self.encoding.encode(" '")[0]}
        for symbol in [*_NON_SPEECH_SYMBOLS, *_MUSIC_SYMBOLS]:
            for tokens in (self.encoding.encode(symbol), self.encoding.encode(" " + symbol)):
                if len(tokens) == 1 or symbol in _MUSIC_SYMBOLS:
                    result.add(tokens[0])
        return tuple(sorted(result))

    def split_to_word_tokens(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
        if self.language in {"zh", "ja", "th", "lo", "my", "yue"}:
            # No spaces between words: split wherever the tokens decode to whole code points.
            return self.split_tokens_on_unicode(tokens)
        return self.split_tokens_on_spaces(tokens)

    def split_tokens_on_unicode(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
        full = self.decode_with_timestamps(tokens)
        words: list[str] = []
        word_tokens: list[list[int]] = []
        pending: list[int] = []
        offset = 0
        for token in tokens:
            pending.append(token)
            text = self.decode_with_timestamps(pending)
            if "\ufffd" not in text or full[offset + text.index("\ufffd")] == "\ufffd":
                words.append(text)
                word_tokens.append(pending)
                pending = []
                offset += len(text)
        return words, word_tokens

    def split_tokens_on_spaces(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
        words: list[str] = []
        word_tokens: list[list[int]] = []
        for subword, subword_tokens in zip(*self.split_tokens_on_unicode(tokens), strict=True):
            starts_word = subword_tokens[0] >= self.eot or subword.startswith(" ")
            if starts_word or subword.strip() in string.punctuation or not words:
                words.append(subword)
                word_tokens.append(subword_tokens)
            else:
                words[-1] += subword
                word_tokens[-1].extend(subword_tokens)
        return words, word_tokens


def normalize_language(language: str | None) -> str | None:
    """A language code from a code or a name ("English", "mandarin"), as mlx-whisper accepts."""
    if language is None:
        return None
    language = language.lower()
    if language in LANGUAGES:
        return language
    if language in TO_LANGUAGE_CODE:
        return TO_LANGUAGE_CODE[language]
    raise ValueError(f"Unsupported language: {language}")


def get_tokenizer(
    encoding: tiktoken.Encoding,
    *,
    multilingual: bool,
    num_languages: int = 99,
    language: str | None = None,
    task: str | None = None,
) -> Tokenizer:
    """mlx-whisper's `get_tokenizer` on a given encoding: a multilingual model defaults to
    English transcription; an English-only one has no language or task token."""
    language = normalize_language(language)
    if multilingual:
        language = language or "en"
        task = task or "transcribe"
    else:
        language = None
        task = None
    return _shared_tokenizer(encoding, num_languages, language, task)


@lru_cache(maxsize=64)
def _shared_tokenizer(
    encoding: tiktoken.Encoding, num_languages: int, language: str | None, task: str | None
) -> Tokenizer:
    # One Tokenizer per (encoding object, language, task), as mlx-whisper caches its
    # get_tokenizer: every decode call asks for one, and a new one would look up its ~1600
    # special tokens and encode the non-speech symbols again.
    return Tokenizer(encoding=encoding, num_languages=num_languages, language=language, task=task)


def tokenizer_for_model(
    model_dir: str | Path, model, *, language: str | None = None, task: str | None = None
) -> Tokenizer:
    """The tokenizer of the Whisper `model` loaded from `model_dir`."""
    encoding = load_encoding(model_dir, model.num_languages, model.dims.n_vocab)
    return get_tokenizer(
        encoding, multilingual=model.is_multilingual, num_languages=model.num_languages, language=language, task=task
    )
