"""Streaming detokenization: text handed out token by token while a model generates, with
mlx-lm's streaming semantics (tokenizer_utils, mlx-lm 0.32.2), written here.

A streamed piece is the text that became printable since the previous piece. Three kinds,
picked from tokenizer.json's `decoder` the way mlx-lm picks its detokenizer class:

- `ByteLevelStream` (decoder type ByteLevel, GPT-2 style byte-level BPE): token strings are
  mapped back to bytes through the GPT-2 byte alphabet; text is released only when the bytes
  held so far decode without a trailing replacement character (a UTF-8 character split over
  tokens waits for its last byte), and a token that is a single space waits for the next
  token. The first released text loses one leading space.
- `SentencePieceStream` (Replace "▁"->" ", ByteFallback, Fuse [, Strip one leading space]):
  "<0xNN>" tokens are bytes, "▁" is a space; the same waiting rule for split characters.
- `DecodeStream` (any other decoder): the tokenizer's own decode of the tokens since the last
  newline, cut before an incomplete character and, where decode cleans " ," up, before a
  trailing space; text up to a newline is final.

`stream_pieces` drives a stream as mlx-lm's `stream_generate` does: one piece per generated
token; the last token's piece includes what `finalize` flushes; a stop token is never added
to the stream and its piece is the flush.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from pathlib import Path

from models.universal.errors import TokenizerError

SPACE = "\u2581"  # SentencePiece's word boundary
REPLACEMENT = "\ufffd"


@lru_cache(maxsize=1)
def gpt2_byte_of_char() -> dict[str, int]:
    """The GPT-2 byte alphabet, inverted: printable Latin-1 bytes stand for themselves, every
    other byte b (in increasing order) for the character 256 + its rank among them."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1))
    printable |= set(range(ord("®"), ord("ÿ") + 1))
    out: dict[str, int] = {}
    rank = 0
    for b in range(256):
        if b in printable:
            out[chr(b)] = b
        else:
            out[chr(256 + rank)] = b
            rank += 1
    return out


class TextStream:
    """Text so far, and the part of it not yet handed out."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.released = ""  # text that can be printed
        self.handed_out = 0  # how much of it `segment()` has returned
        self.tokens: list[int] = []

    def add(self, token: int) -> None:
        raise NotImplementedError

    def finalize(self) -> None:
        raise NotImplementedError

    def current_text(self) -> str:
        return self.released

    def segment(self) -> str:
        """The text released since the previous call."""
        text = self.current_text()
        piece = text[self.handed_out :]
        self.handed_out = len(text)
        return piece


class ByteLevelStream(TextStream):
    def __init__(self, token_strings: Sequence[str | None]):
        self.token_strings = token_strings
        super().__init__()

    def reset(self) -> None:
        super().reset()
        self.pending = ""  # token strings not yet released

    def _lenient_text(self, chars: str) -> str:
        # As mlx-lm's per-token flush: a character outside the byte alphabet, and the one that
        # stands for byte 0 (its lookup is falsy there), is taken as its own UTF-8 bytes.
        table = gpt2_byte_of_char()
        out = bytearray()
        for ch in chars:
            b = table.get(ch)
            if b:
                out.append(b)
            else:
                out += ch.encode("utf-8")
        return out.decode("utf-8", "replace")

    def _without_first_space(self, text: str) -> str:
        return text[1:] if text[:1] == " " and not self.released else text

    def add(self, token: int) -> None:
        self.tokens.append(token)
        # Ids past the token table (a padded embedding) read as "!", as in mlx-lm.
        chars = self.token_strings[token] if token < len(self.token_strings) else "!"
        if chars is None:
            raise TokenizerError(f"token id {token} has no token string in the vocabulary")
        self.pending += chars
        text = self._lenient_text(self.pending)
        lone_space = len(chars) == 1 and gpt2_byte_of_char().get(chars) == 0x20
        if text.endswith(REPLACEMENT) or lone_space:
            return  # an incomplete character, or a space that the next token may need
        self.released += self._without_first_space(text)
        self.pending = ""

    def finalize(self) -> None:
        table = gpt2_byte_of_char()
        try:
            data = bytes(table[ch] for ch in self.pending)
        except KeyError as e:
            raise TokenizerError(f"pending token text holds {e.args[0]!r}, not a byte-level character") from None
        self.released += self._without_first_space(data.decode("utf-8", "replace"))
        self.pending = ""


class SentencePieceStream(TextStream):
    def __init__(self, token_strings: Sequence[str | None], trim_first_space: bool):
        self.token_bytes = [_sentencepiece_bytes(i, s) for i, s in enumerate(token_strings)]
        self.trim_first_space = trim_first_space
        super().__init__()

    def reset(self) -> None:
        super().reset()
        self.pending = b""

    def _flush(self, force: bool) -> None:
        text = self.pending.replace(SPACE.encode(), b" ").decode("utf-8", "replace")
        if not force and text.endswith(REPLACEMENT):
            return
        if self.trim_first_space and not self.released and text[:1] == " ":
            text = text[1:]
        self.released += text
        self.pending = b""

    def add(self, token: int) -> None:
        self.tokens.append(token)
        if token >= len(self.token_bytes):
            raise TokenizerError(f"token id {token} is past the vocabulary ({len(self.token_bytes)} tokens)")
        self.pending += self.token_bytes[token]
        self._flush(force=False)

    def finalize(self) -> None:
        self._flush(force=True)


def _sentencepiece_bytes(token_id: int, token: str | None) -> bytes:
    if token is None:
        raise TokenizerError(f"token id {token_id} has no token string in the vocabulary")
    return bytes([int(token[3:5], 16)]) if token.startswith("<0x") else token.encode("utf-8")


class DecodeStream(TextStream):
    """Re-decodes the tokens since the last newline on every read (quadratic in a line)."""

    def __init__(self, decode: Callable[[list[int]], str], encode: Callable[[str], list[int]]):
        self.decode = decode
        self.drops_space_before_comma = " ," not in decode(encode("a ,b"))
        super().__init__()

    def reset(self) -> None:
        super().reset()
        self.line_tokens: list[int] = []
        self.line_text = ""

    def add(self, token: int) -> None:
        self.tokens.append(token)
        self.line_tokens.append(token)

    def finalize(self) -> None:
        self.released += self.decode(self.line_tokens)
        self.line_tokens = []
        self.line_text = ""

    def _shown(self, text: str) -> str:
        """The line's decode as handed out: an incomplete character (a trailing U+FFFD) is held back,
        and so is a trailing space where decode cleans " ," up (the next token may be the ",")."""
        if text.endswith(REPLACEMENT):
            return text.rstrip(REPLACEMENT)
        if self.drops_space_before_comma and text.endswith(" "):
            return text[:-1]
        return text

    def _restart_at_newline(self) -> None:
        """A line ending in a newline is final: released, and the next line is decoded on its own."""
        if self.line_text.endswith("\n"):
            self.released += self.line_text
            self.line_tokens = []
            self.line_text = ""

    def current_text(self) -> str:
        if self.line_tokens:
            self.line_text = self._shown(self.decode(self.line_tokens))
        self._restart_at_newline()
        return self.released + self.line_text


def _same(a: object, b: object) -> bool:
    """Equal in shape and type, as mlx-lm compares decoders (True is not 1, 1.0 is not 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return len(a) == len(b) and all(k in b and _same(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _matches(decoder: object, steps: list[dict]) -> bool:
    return _same({"type": "Sequence", "decoders": steps}, decoder)


_SPM_STEPS = [
    {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
    {"type": "ByteFallback"},
    {"type": "Fuse"},
]
_SPM_STRIP = {"type": "Strip", "content": " ", "start": 1, "stop": 0}


def stream_kind(decoder: object) -> str:
    """Which stream a tokenizer.json `decoder` gets: "byte-level", "sentencepiece",
    "sentencepiece-keep-space" or "decode"."""
    if _matches(decoder, [*_SPM_STEPS, _SPM_STRIP]):
        return "sentencepiece"
    if _matches(decoder, _SPM_STEPS):
        return "sentencepiece-keep-space"
    if isinstance(decoder, dict) and decoder.get("type") == "ByteLevel":
        return "byte-level"
    return "decode"


def stream_for(model_dir: str | Path, tokenizer) -> TextStream:
    """The stream for a model directory's tokenizer (a ChatTokenizer of the same directory)."""
    path = Path(model_dir) / "tokenizer.json"
    try:
        decoder = json.loads(path.read_text(encoding="utf-8")).get("decoder")
    except (OSError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{path}: cannot read the tokenizer's decoder: {e}") from None
    return stream_of_decoder(decoder, tokenizer)


def stream_of(tokenizer) -> TextStream:
    """The stream for a ChatTokenizer: the decoder of the tokenizer.json it was loaded from, as
    `stream_for` and mlx-lm read it (not the backend's, which transformers may have rebuilt)."""
    return stream_of_decoder(tokenizer.decoder, tokenizer)


def stream_of_decoder(decoder: object, tokenizer) -> TextStream:
    kind = stream_kind(decoder)
    if kind == "decode":
        return DecodeStream(tokenizer.decode, lambda text: tokenizer.encode(text, add_special_tokens=False))
    backend = tokenizer.backend
    strings = [backend.id_to_token(i) for i in range(backend.get_vocab_size(with_added_tokens=True))]
    if kind == "byte-level":
        return ByteLevelStream(strings)
    return SentencePieceStream(strings, trim_first_space=kind == "sentencepiece")


def stream_pieces(stream: TextStream, tokens: Iterable[int], stop_ids: Iterable[int] = ()) -> list[str]:
    """One piece per token, as stream_generate yields them for a run of exactly these tokens:
    the stream is reset; the last token's piece includes the final flush; a token in
    `stop_ids` ends the run without being added, its piece being the flush."""
    tokens = list(tokens)
    stop = set(stop_ids)
    stream.reset()
    pieces = []
    for n, token in enumerate(tokens):
        if token in stop:
            break
        stream.add(token)
        if n + 1 == len(tokens):
            break
        pieces.append(stream.segment())
    stream.finalize()
    if tokens:
        pieces.append(stream.segment())
    return pieces
