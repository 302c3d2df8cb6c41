"""Error paths of models/whisper/ and models/vad/: each test drives one bad input into the
`raise` it must reach and checks the exception's exact type and that its message names the
offending thing. The gates' branch coverage credits these branches as 'error paths tested
by make test' (docs/coverage.md).

Inputs are built in memory or under tmp_path: a tiny randomly initialised Whisper (width 8,
English-only vocabulary size), a synthetic 256-byte vocabulary, config.json and vocabulary
files with one thing wrong; no checkpoint is loaded and no subprocess is started.
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

from models.whisper import audio, timing, tokenizer
from models.whisper.decoding import DecodingTask, decode
from models.whisper.decoding_types import DecodingOptions
from models.whisper.fast import fast_decode
from models.whisper.fast_filters import FastFilters, FilterState
from models.whisper.fast_model import FastWhisper
from models.whisper.language import detect_language
from models.whisper.load import load_model, read_dimensions, read_quantization
from models.whisper.logit_filters import SuppressBlank, SuppressTokens
from models.whisper.model import ModelDimensions, Whisper, sinusoids
from models.whisper.seek_loop import SeekLoop
from models.whisper.token_decoders import BeamSearchDecoder

# English-only (n_vocab 51864: 99 languages), width 8, one layer each side.
DIMS = dict(
    n_mels=8,
    n_audio_ctx=4,
    n_audio_state=8,
    n_audio_head=2,
    n_audio_layer=1,
    n_vocab=51864,
    n_text_ctx=16,
    n_text_state=8,
    n_text_head=2,
    n_text_layer=1,
)


@pytest.fixture(scope="module")
def tiny() -> tuple[Whisper, object]:
    """A tiny seeded Whisper and an encoding of 256 byte ranks plus its special tokens."""
    mx.random.seed(0)
    model = Whisper(ModelDimensions(**DIMS), mx.float32)
    mx.eval(model.parameters())
    ranks = {bytes([b]): b for b in range(256)}
    encoding = tokenizer.build_encoding(ranks, num_languages=model.num_languages)
    return model, encoding


def _features(dtype: mx.Dtype = mx.float32, batch: int = 1) -> mx.array:
    """Already-encoded audio features of the tiny model (`[batch, n_audio_ctx, n_audio_state]`)."""
    return mx.zeros((batch, DIMS["n_audio_ctx"], DIMS["n_audio_state"]), dtype)


# --------------------------------------------------------------------------- audio.py


def test_load_audio_names_the_file_ffmpeg_could_not_decode(tmp_path, monkeypatch) -> None:
    path = tmp_path / "garbage.mp3"
    path.write_bytes(b"not audio at all")
    # ffmpeg's failure, faked: no subprocess runs.
    monkeypatch.setattr(audio.shutil, "which", lambda name: "/usr/bin/ffmpeg")
    failed = subprocess.CompletedProcess([], 1, stdout=b"", stderr=b"Invalid data found when processing input")
    monkeypatch.setattr(audio.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(RuntimeError, match=r"ffmpeg failed to decode .*garbage\.mp3: Invalid data found"):
        audio.load_audio(path)


def test_log10_mel_frames_past_the_signal_names_the_frames_and_samples() -> None:
    with pytest.raises(ValueError, match="frames up to 5 need 840 samples, the signal has 100"):
        audio.log10_mel_frames(mx.zeros((100,)), 0, 5, 80)


# --------------------------------------------------------------------------- decoding.py


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (DecodingOptions(beam_size=2, best_of=2), "beam_size and best_of can't be given together"),
        (DecodingOptions(temperature=0, best_of=2), r"best_of with greedy sampling \(T=0\)"),
        (DecodingOptions(patience=2.0), "patience requires beam_size"),
        (DecodingOptions(length_penalty=1.5), r"length_penalty \(alpha\) should be a value between 0 and 1"),
        (DecodingOptions(length_penalty=-0.1), r"length_penalty \(alpha\) should be a value between 0 and 1"),
    ],
    ids=[
        "beam-and-best-of",
        "best-of-at-t0",
        "patience-without-beam",
        "length-penalty-above-1",
        "length-penalty-below-0",
    ],
)
def test_conflicting_decoding_options(tiny, options, message) -> None:
    model, encoding = tiny
    with pytest.raises(ValueError, match=message):
        DecodingTask(model, options, encoding)


def test_suppress_tokens_that_are_not_a_list(tiny) -> None:
    model, encoding = tiny
    with pytest.raises(TypeError, match="suppress_tokens must be a list"):
        DecodingTask(model, DecodingOptions(language="en", suppress_tokens=(5, 7)), encoding)


@pytest.mark.parametrize("path", ["faithful", "fast"])
def test_audio_features_of_the_wrong_dtype(tiny, path) -> None:
    model, encoding = tiny
    options = DecodingOptions(language="en", fp16=False)
    run = decode if path == "faithful" else fast_decode
    with pytest.raises(TypeError, match="audio_features has an incorrect dtype: mlx.core.float16"):
        run(model if path == "faithful" else FastWhisper(model), _features(mx.float16), encoding, options)


@pytest.mark.parametrize("path", ["faithful", "fast"])
def test_teacher_forcing_with_too_few_forced_sequences(tiny, path) -> None:
    model, encoding = tiny
    options = DecodingOptions(language="en", fp16=False, sample_len=2)
    run = decode if path == "faithful" else fast_decode
    with pytest.raises(ValueError, match="teacher forcing: 1 forced sequences for a batch of 2"):
        run(
            model if path == "faithful" else FastWhisper(model),
            _features(batch=2),
            encoding,
            options,
            forced_tokens=[[65]],
        )


# --------------------------------------------------------------------------- fast_filters.py, fast_model.py


def test_filter_state_from_rows_of_unequal_length() -> None:
    with pytest.raises(ValueError, match=r"every row must have sampled as many tokens, got lengths \[1, 2\]"):
        FilterState.from_sampled([[1], [1, 2]], timestamp_begin=300)


def test_fast_filters_in_an_order_the_fast_path_does_not_apply(tiny) -> None:
    model, encoding = tiny
    tok = tokenizer.get_tokenizer(encoding, multilingual=False, num_languages=model.num_languages)
    n_vocab = DIMS["n_vocab"]
    swapped = [SuppressTokens([5], n_vocab), SuppressBlank(tok, 1, n_vocab)]
    with pytest.raises(ValueError, match=r"logit filters in order \['SuppressTokens', 'SuppressBlank'\]"):
        FastFilters.from_decoding(swapped, n_vocab)


def test_fast_whisper_of_something_else() -> None:
    with pytest.raises(TypeError, match="FastWhisper needs a loaded models.whisper.model.Whisper, got dict"):
        FastWhisper({})


def test_fast_prefill_longer_than_the_text_context(tiny) -> None:
    fast = FastWhisper(tiny[0])
    with pytest.raises(ValueError, match="a prompt of 17 tokens exceeds the text context of 16"):
        fast.prefill(mx.zeros((1, 17), mx.int32), [], 0)


# --------------------------------------------------------------------------- language.py


def test_language_id_with_an_english_only_tokenizer(tiny) -> None:
    model, encoding = tiny
    tok = tokenizer.get_tokenizer(encoding, multilingual=False, num_languages=model.num_languages)
    with pytest.raises(ValueError, match="doesn't have language tokens so it can't perform lang id"):
        detect_language(model, _features(), tok)


# --------------------------------------------------------------------------- load.py


def _model_dir(tmp_path: Path, config: object) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    ("config", "error", "message"),
    [
        (None, FileNotFoundError, "no config.json in"),
        ([1, 2], ValueError, r"config\.json: expected a JSON object"),
        ({**DIMS, "model_type": "llama"}, ValueError, r"config\.json: model_type 'llama' is not 'whisper'"),
    ],
    ids=["no-config", "config-not-an-object", "model-type-not-whisper"],
)
def test_read_dimensions_of_a_bad_config(tmp_path, config, error, message) -> None:
    model_dir = tmp_path if config is None else _model_dir(tmp_path, config)
    with pytest.raises(error, match=message):
        read_dimensions(model_dir)


def test_quantization_that_is_not_an_object(tmp_path) -> None:
    model_dir = _model_dir(tmp_path, {**DIMS, "model_type": "whisper", "quantization": 4})
    with pytest.raises(ValueError, match=r"quantization must be an object \{group_size, bits\}, got 4"):
        read_quantization(model_dir)


def test_load_model_without_a_weights_file(tmp_path) -> None:
    model_dir = _model_dir(tmp_path, {**DIMS, "model_type": "whisper"})
    with pytest.raises(FileNotFoundError, match="no weights.safetensors or weights.npz in"):
        load_model(model_dir)


# --------------------------------------------------------------------------- model.py


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n_audio_head": 3}, "heads must divide the state width"),
        ({"n_text_head": 3}, "heads must divide the state width"),
        ({"n_audio_state": 9, "n_audio_head": 3}, "n_audio_state must be even for the sinusoids, got 9"),
    ],
    ids=["audio-heads-do-not-divide", "text-heads-do-not-divide", "odd-audio-state"],
)
def test_model_dimensions_that_do_not_fit(changes, message) -> None:
    with pytest.raises(ValueError, match=message):
        ModelDimensions(**{**DIMS, **changes})


def test_sinusoids_of_an_odd_channel_count() -> None:
    with pytest.raises(ValueError, match="sinusoids need an even channel count, got 7"):
        sinusoids(4, 7)


@pytest.mark.parametrize(
    ("heads", "message"),
    [
        (np.array([0, 1]), r"alignment heads must be \[n, 2\] \(layer, head\) pairs, got shape \(2,\)"),
        (np.array([[0, 1, 0]]), r"alignment heads must be \[n, 2\] \(layer, head\) pairs, got shape \(1, 3\)"),
        (np.array([[1, 0]]), r"alignment heads \[\[1, 0\]\] out of range"),
        (np.array([[0, 2]]), r"alignment heads \[\[0, 2\]\] out of range"),
        (np.array([[0, -1]]), r"alignment heads \[\[0, -1\]\] out of range"),
    ],
    ids=["one-dimensional", "three-columns", "layer-out-of-range", "head-out-of-range", "negative-head"],
)
def test_alignment_heads_that_do_not_fit(heads, message) -> None:
    model = Whisper(ModelDimensions(**DIMS), mx.float32)
    with pytest.raises(ValueError, match=message):
        model.set_alignment_heads(heads)


# --------------------------------------------------------------------------- seek_loop.py, timing.py, token_decoders.py


def test_teacher_forcing_past_the_reference_decode_calls(tiny) -> None:
    model, encoding = tiny
    loop = SeekLoop(model, encoding, forced_calls=[], language="en", fp16=False)
    with pytest.raises(ValueError, match="teacher forcing: the reference run has no more decode calls"):
        loop.decode_with_fallback(mx.zeros((3000, DIMS["n_mels"])), 0, 3000)


@pytest.mark.parametrize("bad", [-1, 3], ids=["never-reached", "unknown-step"])
def test_dtw_backtrace_through_an_unreached_cell(bad) -> None:
    trace = np.full((3, 3), bad, dtype=np.int8)
    with pytest.raises(ValueError, match=r"dtw: cell \(2, 2\) was never reached"):
        timing._backtrace(trace)


def test_beam_update_with_rows_not_a_multiple_of_the_beam() -> None:
    beam = BeamSearchDecoder(beam_size=2, eot=256, inference=SimpleNamespace())
    tokens, logits = mx.zeros((3, 1), mx.int32), mx.zeros((3, 300))
    with pytest.raises(ValueError, match="beam search: 3 rows is not a multiple of beam_size 2"):
        beam.update(tokens, logits, mx.zeros((3,)))


# --------------------------------------------------------------------------- tokenizer.py


def _tiktoken_lines(ranks: dict[bytes, int]) -> str:
    return "".join(f"{base64.b64encode(token).decode()} {rank}\n" for token, rank in ranks.items())


@pytest.mark.parametrize(
    ("files", "error", "message"),
    [
        ({}, FileNotFoundError, r"no \*\.tiktoken, vocabulary\.txt or tokenizer\.json"),
        (
            {"a.tiktoken": _tiktoken_lines({b"a": 0}), "b.tiktoken": _tiktoken_lines({b"a": 0})},
            ValueError,
            r"more than one \.tiktoken vocabulary: \['a\.tiktoken', 'b\.tiktoken'\]",
        ),
        ({"vocabulary.txt": "a\nb\nc"}, ValueError, r"vocabulary\.txt: no <\|endoftext\|> line ends the byte-pair"),
        (
            {"gpt2.tiktoken": _tiktoken_lines({b"a": 0, b"b": 2})},
            ValueError,
            r"byte-pair ranks are not 0\.\.1 without gaps",
        ),
    ],
    ids=["no-vocabulary-file", "two-tiktoken-files", "vocabulary-txt-without-endoftext", "ranks-with-a-gap"],
)
def test_read_ranks_of_a_bad_vocabulary(tmp_path, files, error, message) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(error, match=message):
        tokenizer.read_ranks(tmp_path)
