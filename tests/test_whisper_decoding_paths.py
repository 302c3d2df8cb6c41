"""Decoding paths no gate can reach, judged against mlx-whisper's own `decode` (issue 53).

The mlx-whisper oracle generator runs `transcribe` only (oracles/common/whisper_spec.py
KINDS), and transcribe never calls `decode` with a batch of windows, already-encoded audio
features, keyword overrides, `task="lang_id"` or without a language (it detects the language
itself, one window at a time, before decoding). A user of `decode` can do each of these, so each
is compared here with `mlx_whisper.decoding.decode` run in its pinned venv (tests/oracle_call.py)
on the whisper-large-v3-turbo mini twin: every result field, floats by their bits. (The twin's
random weights detect "km" for every clip, so which window's language lands in which row is
judged by the lang_id case's per-window probabilities.)

fp16 compute needs float16 weights (with float32 weights both sides refuse the float32 audio
features: TypeError), and no CPU profile has them (whisper-large-v3-turbo-fp16 is GPU-only), so
the fp16 case runs on a float16 copy of the mini twin's weights, faithful and fast path.

Also here: what the fast path computes without an observer (the gates always observe), the
fused model returned as is by `as_fast`, and an empty alignment-heads list.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from models.whisper.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim
from models.whisper.decoding import decode
from models.whisper.decoding_types import DecodingOptions, DecodingResult
from models.whisper.fast import fast_decode
from models.whisper.fast_model import FastWhisper, as_fast
from models.whisper.hooks import DecodeObserver
from models.whisper.load import load_model
from models.whisper.tokenizer import load_encoding
from tests.oracle_call import oracle_answer

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("whisper-large-v3-turbo-mini")]

MODEL = "whisper-large-v3-turbo-mini"
CLIPS = ("fixtures/audio/fox.wav", "fixtures/audio/weather.wav")

# Each case: which weights, which input (both windows, the first only, or both windows'
# encoder output), the DecodingOptions and the keyword overrides passed to decode.
CASES: dict[str, dict[str, Any]] = {
    # no language: DecodingTask detects it per window of the batch (detect_language on a batch
    # of already-encoded features) and writes each window's language token
    "batch-detect-language": {"input": "batch", "options": {"temperature": 0.0, "sample_len": 8}},
    # lang_id with a language given: detection only, the given language's tokens kept
    "batch-lang-id": {"input": "batch", "options": {"task": "lang_id", "language": "en"}},
    # lang_id without a language, one window
    "lang-id-detect": {"input": "single", "options": {"task": "lang_id"}},
    # the encoder output given instead of a Mel window: not encoded again
    "features": {"input": "features", "options": {"language": "en", "temperature": 0.0, "sample_len": 8}},
    # keyword arguments override the options
    "kwargs": {
        "input": "single",
        "options": {"language": "en", "temperature": 0.0},
        "kwargs": {"sample_len": 4, "without_timestamps": True},
    },
    # fp16 compute on float16 weights
    "fp16": {"input": "single", "weights": "fp16", "options": {"language": "en", "temperature": 0.0, "sample_len": 8}},
}

ORACLE_DECODE = """
import json, math, sys
from pathlib import Path
import mlx.core as mx
import numpy as np
from mlx_whisper.decoding import DecodingOptions, decode
from mlx_whisper.load_models import load_model

def num(x):
    return "nan" if isinstance(x, float) and math.isnan(x) else float(x).hex()

def record(r):
    return {
        "language": r.language,
        "language_probs": None if r.language_probs is None else {k: num(v) for k, v in r.language_probs.items()},
        "tokens": [int(t) for t in r.tokens],
        "text": r.text,
        "avg_logprob": num(r.avg_logprob),
        "no_speech_prob": num(r.no_speech_prob),
        "temperature": num(r.temperature),
        "compression_ratio": num(r.compression_ratio),
    }

job = json.loads(Path(sys.argv[1]).read_text())
mel = mx.array(np.load("mel.npy"))
models, out = {}, {}
for name, case in job["cases"].items():
    weights = case.get("weights", "fp32")
    if weights not in models:
        models[weights] = load_model(job["dirs"][weights], mx.float16 if weights == "fp16" else mx.float32)
    model = models[weights]
    x = {"batch": mel, "single": mel[0], "features": model.embed_audio(mel)}[case["input"]]
    options = {"fp16": weights == "fp16", **case["options"]}
    results = decode(model, x, DecodingOptions(**options), **case.get("kwargs", {}))
    out[name] = [record(r) for r in (results if isinstance(results, list) else [results])]
Path(sys.argv[2]).write_text(json.dumps(out))
"""


def _num(x: float) -> str:
    return "nan" if isinstance(x, float) and math.isnan(x) else float(x).hex()


def _record(r: DecodingResult) -> dict[str, Any]:
    """A result's fields as the oracle script writes them (floats by their bits)."""
    probs = None if r.language_probs is None else {k: _num(v) for k, v in r.language_probs.items()}
    return {
        "language": r.language,
        "language_probs": probs,
        "tokens": [int(t) for t in r.tokens],
        "text": r.text,
        "avg_logprob": _num(r.avg_logprob),
        "no_speech_prob": _num(r.no_speech_prob),
        "temperature": _num(r.temperature),
        "compression_ratio": _num(r.compression_ratio),
    }


@pytest.fixture(scope="module")
def mini(tmp_path_factory) -> dict[str, Any]:
    """The mini twin (float32 and a float16 copy), its encoding and two Mel windows."""
    from harness.session import ParitySession

    session = ParitySession()
    model_dir = Path(session.artifact(session.profile(MODEL)).model_dir)
    fp16_dir = tmp_path_factory.mktemp("mini-fp16")
    for name in ("config.json", "multilingual.tiktoken"):
        shutil.copy(model_dir / name, fp16_dir / name)
    weights = mx.load(str(model_dir / "weights.safetensors"))
    mx.save_safetensors(
        str(fp16_dir / "weights.safetensors"),
        {k: v.astype(mx.float16) if v.dtype == mx.float32 else v for k, v in weights.items()},
    )
    models = {"fp32": load_model(model_dir, mx.float32), "fp16": load_model(fp16_dir, mx.float16)}
    dims = models["fp32"].dims
    encoding = load_encoding(model_dir, models["fp32"].num_languages, dims.n_vocab)
    mel = mx.stack([pad_or_trim(log_mel_spectrogram(c, n_mels=dims.n_mels), N_FRAMES, axis=-2) for c in CLIPS])
    mx.eval(mel)
    return {"dirs": {"fp32": str(model_dir), "fp16": str(fp16_dir)}, "models": models, "encoding": encoding, "mel": mel}


@pytest.fixture(scope="module")
def oracle(mini, tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    """mlx-whisper's decode of every case (one oracle venv start)."""
    workdir = tmp_path_factory.mktemp("mlx-whisper-decode")
    np.save(workdir / "mel.npy", np.array(mini["mel"]))
    job = {"dirs": mini["dirs"], "cases": CASES}
    return oracle_answer("mlx-whisper", ORACLE_DECODE, job, workdir)


def in_tree(mini: dict[str, Any], case: dict[str, Any], decode_fn=decode, **hooks: Any) -> list[dict[str, Any]]:
    """The in-tree decode of `case`, recorded as the oracle script records mlx-whisper's."""
    weights = case.get("weights", "fp32")
    model, mel = mini["models"][weights], mini["mel"]
    x = {"batch": mel, "single": mel[0], "features": model.embed_audio(mel)}[case["input"]]
    options = DecodingOptions(**{"fp16": weights == "fp16", **case["options"]})
    if decode_fn is fast_decode:
        model = as_fast(model)
    results = decode_fn(model, x, mini["encoding"], options, **hooks, **case.get("kwargs", {}))
    return [_record(r) for r in (results if isinstance(results, list) else [results])]


@pytest.mark.parametrize("name", list(CASES))
def test_decode_equals_mlx_whisper_decode(name: str, mini, oracle) -> None:
    theirs = oracle[name]
    mine = in_tree(mini, CASES[name])
    n_audio = 2 if CASES[name]["input"] in ("batch", "features") else 1
    assert len(theirs) == n_audio
    # not vacuous: lang_id gives every language's probability, the others tokens
    if CASES[name]["options"].get("task") == "lang_id":
        assert all(len(r["language_probs"]) == 100 and not r["tokens"] for r in theirs), theirs
    else:
        assert all(r["tokens"] and r["language_probs"] is None for r in theirs), theirs
    assert mine == theirs


def test_the_cases_walk_what_they_name(oracle) -> None:
    # kwargs took effect: 4 tokens, no timestamp tokens
    assert all(len(r["tokens"]) == 4 for r in oracle["kwargs"]), oracle["kwargs"]
    # a language was detected per window
    detected = [r["language"] for r in oracle["batch-detect-language"]]
    assert all(isinstance(lang, str) and lang for lang in detected), detected
    # lang_id with a language given still reports the detected language
    assert [r["language"] for r in oracle["batch-lang-id"]] == detected


def test_fast_path_fp16_decodes_the_oracle_tokens(mini, oracle) -> None:
    """fp16 on the fast path (L2: other roundings): the oracle's greedy tokens on this window."""
    mine = in_tree(mini, CASES["fp16"], decode_fn=fast_decode)
    assert [r["tokens"] for r in mine] == [r["tokens"] for r in oracle["fp16"]]


class _Recording(DecodeObserver):
    """What the gates' observer reads: every step, the fast path's own picks and its filters."""

    def __init__(self) -> None:
        self.steps: list[tuple[list[int], bool]] = []
        self.picks: list[tuple[list[int], bool]] = []
        self.filters: list[dict[str, Any]] = []

    def on_step(self, logits, tokens, kept) -> None:
        self.steps.append((tokens.tolist(), kept))

    def on_fast_step(self, picks, kept) -> None:
        self.picks.append((picks.tolist(), kept))

    def on_fast_filters(self, filters) -> None:
        self.filters.append(filters)


def test_fast_path_without_an_observer_computes_what_it_observes(mini) -> None:
    case = {"input": "batch", "options": {"language": "en", "temperature": 0.0, "sample_len": 8}}
    recording = _Recording()
    observed = in_tree(mini, case, decode_fn=fast_decode, observer=recording)
    assert recording.steps and recording.picks and recording.filters  # the observed run read every step
    plain = in_tree(mini, case, decode_fn=fast_decode, observer=DecodeObserver())  # no fast-path hooks
    unobserved = in_tree(mini, case, decode_fn=fast_decode)
    assert unobserved == observed
    assert plain == observed


def test_as_fast_returns_a_fused_model_as_is(mini) -> None:
    fast = as_fast(mini["models"]["fp32"])
    assert isinstance(fast, FastWhisper)
    assert as_fast(fast) is fast
    assert as_fast(mini["models"]["fp32"]) is fast  # built once per model


def test_an_empty_alignment_heads_list_is_accepted(mini) -> None:
    """mlx-whisper takes a checkpoint's `alignment_heads` tensor as is (model.update); an empty
    [0, 2] one has nothing to range-check. Out-of-range heads are still refused."""
    model = load_model(mini["dirs"]["fp32"], mx.float32)
    model.set_alignment_heads(np.zeros((0, 2), np.int64))
    assert model.alignment_heads.shape == (0, 2)
    with pytest.raises(ValueError, match="out of range"):
        model.set_alignment_heads(np.array([[model.dims.n_text_layer, 0]]))


def test_the_oracle_script_records_what_the_test_compares() -> None:
    # The two recorders agree field for field (a field added to one must be added to the other).
    for field in _record(DecodingResult(audio_features=mx.zeros(1), language="en")):
        assert f'"{field}":' in ORACLE_DECODE
