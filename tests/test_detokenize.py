"""The in-tree streaming detokenizer (models/universal/detokenize.py) and the `detokenize` gate."""

from __future__ import annotations

import pytest

from models.universal.detokenize import (
    ByteLevelStream,
    DecodeStream,
    SentencePieceStream,
    gpt2_byte_of_char,
    stream_kind,
    stream_pieces,
)

CHAR_OF_BYTE = {b: ch for ch, b in gpt2_byte_of_char().items()}


def byte_level(text: str) -> str:
    """A token string of the GPT-2 byte alphabet for `text`'s UTF-8 bytes."""
    return "".join(CHAR_OF_BYTE[b] for b in text.encode("utf-8"))


def test_the_byte_alphabet_covers_every_byte_once() -> None:
    assert sorted(gpt2_byte_of_char().values()) == list(range(256))
    assert CHAR_OF_BYTE[ord(" ")] == "\u0120" and CHAR_OF_BYTE[ord("a")] == "a"


def test_a_character_split_over_tokens_is_handed_out_only_when_complete() -> None:
    e_acute, kanji = "é".encode(), "東".encode()
    strings = [
        byte_level(" Caf"),
        CHAR_OF_BYTE[e_acute[0]],
        CHAR_OF_BYTE[e_acute[1]],
        CHAR_OF_BYTE[kanji[0]],
        CHAR_OF_BYTE[kanji[1]] + CHAR_OF_BYTE[kanji[2]],
        byte_level("!"),
    ]
    stream = ByteLevelStream(strings)
    # The first piece loses its leading space; é waits for its second byte, 東 for its third.
    assert stream_pieces(stream, [0, 1, 2, 3, 4, 5]) == ["Caf", "", "é", "", "東", "!"]
    # Ending mid-character: the final flush hands out the replacement character.
    assert stream_pieces(stream, [0, 3]) == ["Caf", "\ufffd"]


def test_a_lone_space_waits_for_the_next_token_and_a_stop_token_is_never_added() -> None:
    stream = ByteLevelStream([byte_level("a"), byte_level(" "), byte_level("b"), "<|im_end|>"])
    assert stream_pieces(stream, [0, 1, 2]) == ["a", "", " b"]
    assert stream_pieces(stream, [0, 1, 3]) == ["a", "", " <|im_end|>"]  # no stop: an ordinary token
    assert stream_pieces(stream, [0, 1, 3], stop_ids=[3]) == ["a", "", " "]  # stop: its piece is the flush


def test_sentencepiece_byte_tokens_join_into_one_character() -> None:
    strings = ["\u2581Caf", "<0xC3>", "<0xA9>", "\u2581ok"]
    assert stream_pieces(SentencePieceStream(strings, trim_first_space=True), [0, 1, 2, 3]) == ["Caf", "", "é", " ok"]
    assert stream_pieces(SentencePieceStream(strings, trim_first_space=False), [0, 1, 2]) == [" Caf", "", "é"]


def test_decode_stream_holds_an_incomplete_character_back() -> None:
    text = {0: b"ab", 1: b"\xc3", 2: b"\xa9", 3: b"\n"}

    def decode(ids: list[int]) -> str:
        return b"".join(text[i] for i in ids).decode("utf-8", "replace")

    stream = DecodeStream(decode, lambda s: [0])
    assert stream_pieces(stream, [0, 1, 2, 3, 0]) == ["ab", "", "é", "\n", "ab"]


def test_the_stream_kind_follows_the_tokenizer_decoder() -> None:
    spm = [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    strip = {"type": "Strip", "content": " ", "start": 1, "stop": 0}
    assert stream_kind({"type": "ByteLevel", "add_prefix_space": True}) == "byte-level"
    assert stream_kind({"type": "Sequence", "decoders": [*spm, strip]}) == "sentencepiece"
    assert stream_kind({"type": "Sequence", "decoders": spm}) == "sentencepiece-keep-space"
    assert stream_kind({"type": "WordPiece"}) == stream_kind(None) == "decode"


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2-135m")
def test_detokenize_fails_on_an_in_tree_stream_that_drops_a_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-tree byte-level stream that drops the byte completing a multi-byte character
    (judged on SmolLM2's Japanese scenario against the real mlx-lm golden) fails, naming the
    token, its id and both pieces."""
    from harness.session import ParitySession
    from models.universal import detokenize

    stream_for = detokenize.stream_for

    def dropping(model_dir, tokenizer):
        stream = stream_for(model_dir, tokenizer)
        table = gpt2_byte_of_char()
        stream.token_strings = [s[:-1] if s and table.get(s[-1], 0) & 0xC0 == 0x80 else s for s in stream.token_strings]
        return stream

    monkeypatch.setattr(detokenize, "stream_for", dropping)
    session = ParitySession()
    profile = session.profile("smollm2-135m")
    result = session.run_check(profile, profile.scenario("multibyte-japanese"), "detokenize")
    assert not result.passed, result.summary
    assert "streamed piece differs at token" in result.summary and "(token id " in result.summary, result.summary
    details = result.details
    assert details["oracle"] != details["intree"] and details["token_id"] is not None


def test_a_logits_difference_is_not_blamed_on_teacher_forcing() -> None:
    """The audit's misleading message: the teacher-forced record's tokens are the model's picks,
    so a logits bug made detokenize say 'teacher forcing broke'. It names the step instead."""
    import numpy as np

    from harness.checks.text import compare_stream_text
    from harness.records import ScenarioRecord

    def record(tokens: list[int]) -> ScenarioRecord:
        text = [{"pieces": ["a"] * len(tokens), "decoded": "a" * len(tokens)}]
        logits = np.zeros((len(tokens), 4), np.float32)
        return ScenarioRecord("s", None, [1], tokens, logits, [3], extra={"stream_text": text})

    result = compare_stream_text(record([1, 2, 0]), record([1, 0, 0]))
    assert not result.passed and result.first_bad_step == 1
    assert "picked other tokens than the oracle (step 1: oracle 2, in-tree 0): a logits difference" in result.summary
    assert "teacher forcing broke" not in result.summary
