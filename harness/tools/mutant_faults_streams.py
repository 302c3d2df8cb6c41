"""The SentencePiece and decode-based stream faults (issue 31: "SentencePiece and decode-based
streams are never gated by any artifact"): the in-tree SentencePieceStream and DecodeStream
(models/universal/detokenize.py) patched in process, each judged on the SentencePiece Llama twin
scenario that walks its path (profiles/llama-spm-mini.yaml, llama-spm-keep-space-mini.yaml,
llama-unigram-mini.yaml; docs/twins.md "SentencePiece Llama twins").

Every twin of the byte-level profiles (SmolLM2, MiniCPM5) streams through ByteLevelStream, so each
of these faults passes all of their gates; here each is killed by `detokenize`."""

from __future__ import annotations

import contextlib
from typing import Any

from harness.tools.mutant_faults import Mutant, _setattr

SPM = "llama-spm-mini"
SPM_KEEP_SPACE = "llama-spm-keep-space-mini"
UNIGRAM = "llama-unigram-mini"


def _spm_flush(trim: Any) -> contextlib.AbstractContextManager[None]:
    """SentencePieceStream._flush as written, its first-space rule replaced by `trim(stream, text)`
    (True: drop the text's leading space)."""
    from models.universal.detokenize import REPLACEMENT, SPACE, SentencePieceStream

    def _flush(self: Any, force: bool) -> None:
        text = self.pending.replace(SPACE.encode(), b" ").decode("utf-8", "replace")
        if not force and text.endswith(REPLACEMENT):
            return
        if text[:1] == " " and trim(self, text):
            text = text[1:]
        self.released += text
        self.pending = b""

    return _setattr(SentencePieceStream, "_flush", _flush)


def spm_first_space_kept() -> contextlib.AbstractContextManager[None]:
    """The SentencePiece stream never trims the first space (as if every decoder lacked Strip)."""
    return _spm_flush(lambda stream, text: False)


def spm_first_space_always_trimmed() -> contextlib.AbstractContextManager[None]:
    """The SentencePiece stream trims the first space whatever the decoder says (a decoder without
    Strip, Gemma's shape, keeps it in mlx-lm: SPMStreamingDetokenizer(trim_space=False))."""
    return _spm_flush(lambda stream, text: not stream.released)


def spm_trims_first_token_only() -> contextlib.AbstractContextManager[None]:
    """The first-space trim keyed on the first token, not on the first released text: mlx-lm trims
    every flush while nothing has been released, so a lone "▁" first (released as "") does not use
    the trim up."""
    return _spm_flush(lambda stream, text: stream.trim_first_space and len(stream.tokens) == 1)


def spm_finalize_drops_flush() -> contextlib.AbstractContextManager[None]:
    """SentencePieceStream.finalize() forgets what add() held back (an incomplete UTF-8 character
    flushed as U+FFFD): only a stream that ends on held text shows it."""
    from models.universal.detokenize import SentencePieceStream

    def finalize(self: Any) -> None:
        self.pending = b""

    return _setattr(SentencePieceStream, "finalize", finalize)


def spm_byte_tokens_as_text() -> contextlib.AbstractContextManager[None]:
    """Byte-fallback tokens ("<0xE6>") read as their own text instead of the byte they stand for
    (the ByteFallback step of the decoder left out)."""
    from models.universal import detokenize

    def token_bytes(token_id: int, token: str | None) -> bytes:
        if token is None:
            raise detokenize.TokenizerError(f"token id {token_id} has no token string in the vocabulary")
        return token.encode("utf-8")

    return _setattr(detokenize, "_sentencepiece_bytes", token_bytes)


def spm_served_by_decode() -> contextlib.AbstractContextManager[None]:
    """A SentencePiece decoder shape served with the decode-based stream (mlx-lm's naive one), as a
    decoder match that misses the Replace/ByteFallback/Fuse[/Strip] sequence would: the text is the
    same, the pieces are not (a character completed after another one is handed out again)."""
    from models.universal import detokenize

    kind = detokenize.stream_kind

    def stream_kind(decoder: object) -> str:
        found = kind(decoder)
        return "decode" if found.startswith("sentencepiece") else found

    return _setattr(detokenize, "stream_kind", stream_kind)


def decode_releases_replacement() -> contextlib.AbstractContextManager[None]:
    """DecodeStream hands out a decode ending in U+FFFD (an incomplete character) instead of holding
    it back until the character completes."""
    from models.universal.detokenize import DecodeStream

    def shown(self: Any, text: str) -> str:
        if self.drops_space_before_comma and text.endswith(" "):
            return text[:-1]
        return text

    return _setattr(DecodeStream, "_shown", shown)


def decode_releases_trailing_space() -> contextlib.AbstractContextManager[None]:
    """DecodeStream hands out a trailing space although the tokenizer's decode cleans " ," up (mlx-lm
    holds it: the next token may be the "," that removes it)."""
    from models.universal.detokenize import DecodeStream

    init = DecodeStream.__init__

    def without_hold(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.drops_space_before_comma = False

    return _setattr(DecodeStream, "__init__", without_hold)


def decode_no_line_restart() -> contextlib.AbstractContextManager[None]:
    """DecodeStream never makes the text up to a newline final: it decodes every token since the
    start on every read (mlx-lm starts a new line's decode after each newline, where a Metaspace
    decoder drops the space of the line's first word)."""
    from models.universal.detokenize import DecodeStream

    def restart_at_newline(self: Any) -> None:
        pass

    return _setattr(DecodeStream, "_restart_at_newline", restart_at_newline)


def decode_finalize_drops_flush() -> contextlib.AbstractContextManager[None]:
    """DecodeStream.finalize() releases only what reads released: a last incomplete character
    (what only the final decode flushes, as U+FFFD) is dropped."""
    from models.universal.detokenize import DecodeStream

    def finalize(self: Any) -> None:
        self.released = self.current_text()
        self.line_tokens = []
        self.line_text = ""

    return _setattr(DecodeStream, "finalize", finalize)


STREAM_MUTANTS = [
    Mutant(
        "spm-first-space-kept",
        "the SentencePiece stream keeps the first space a Strip decoder drops",
        SPM,
        "first-space",
        patch=spm_first_space_kept,
    ),
    Mutant(
        "spm-first-space-always-trimmed",
        "the SentencePiece stream trims the first space of a decoder without Strip",
        SPM_KEEP_SPACE,
        "first-space",
        patch=spm_first_space_always_trimmed,
    ),
    Mutant(
        "spm-trim-first-token-only",
        "the first-space trim applies to the first token only, not to every flush before text is released",
        SPM,
        "first-space",
        patch=spm_trims_first_token_only,
    ),
    Mutant(
        "spm-finalize-drops-flush",
        "the SentencePiece stream's finalize() drops the incomplete character add() held back",
        SPM,
        "multibyte-held-end",
        patch=spm_finalize_drops_flush,
    ),
    Mutant(
        "spm-byte-tokens-as-text",
        "byte-fallback tokens (<0xNN>) streamed as their own text, not as the byte",
        SPM,
        "multibyte-forced",
        patch=spm_byte_tokens_as_text,
    ),
    Mutant(
        "spm-served-by-decode",
        "a SentencePiece decoder served with the decode-based stream",
        SPM,
        "multibyte-forced",
        patch=spm_served_by_decode,
    ),
    Mutant(
        "decode-releases-replacement",
        "the decode-based stream hands out a trailing U+FFFD before the character completes",
        UNIGRAM,
        "multibyte-forced",
        patch=decode_releases_replacement,
    ),
    Mutant(
        "decode-releases-trailing-space",
        "the decode-based stream hands out a trailing space its decode's ' ,' cleanup may remove",
        UNIGRAM,
        "clean-spaces",
        patch=decode_releases_trailing_space,
    ),
    Mutant(
        "decode-no-line-restart",
        "the decode-based stream never makes a line final at its newline",
        UNIGRAM,
        "clean-spaces",
        patch=decode_no_line_restart,
    ),
    Mutant(
        "decode-finalize-drops-flush",
        "the decode-based stream's finalize() drops the incomplete character it held back",
        UNIGRAM,
        "multibyte-held-end",
        patch=decode_finalize_drops_flush,
    ),
]
