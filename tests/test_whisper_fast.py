"""The Whisper fast path: fused weights, array logit filters, greedy loop, and its L2 gate.

Unit tests run on a small seeded Whisper (width 64, the tiny.en vocabulary); the gate runs on
the real tiny.en weights over fixtures/audio/fox.wav against the committed mlx-whisper golden,
and must fail on perturbed fast paths and on synthetic records with a flip it cannot explain.
"""

from __future__ import annotations

from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from harness.checks.compare import raw_bits
from harness.checks.token_budget import check_token_budget, measure, token_differences
from harness.goldens.calibration import CalibrationRecord, golden_identity
from harness.records import ScenarioRecord
from harness.runners.whisper_record import fast_transcribe_record
from models.whisper import fast_model
from models.whisper.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim
from models.whisper.decoding import DecodingTask, decode
from models.whisper.decoding_types import DecodingOptions
from models.whisper.fast import fast_decode
from models.whisper.fast_filters import FastFilters, FilterState
from models.whisper.fast_model import FastWhisper
from models.whisper.hooks import DecodeObserver
from models.whisper.model import ModelDimensions, Whisper
from models.whisper.tokenizer import load_encoding

MODEL = "whisper-tiny-en"
FOX = "fixtures/audio/fox.wav"
# fp32 fast encoder vs the faithful one: other summation orders (fused SDPA, one q|k|v
# matmul); seen ~1e-6 at unit-scale activations, a wrong fusion is O(1).
ENCODER_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def artifact_dir():
    from harness.session import ParitySession

    session = ParitySession()
    return session.artifact(session.profile(MODEL)).model_dir


@pytest.fixture(scope="module")
def small(artifact_dir):
    """A seeded width-64 Whisper with the tiny.en vocabulary, its encoding and a fox window."""
    mx.random.seed(0)
    dims = ModelDimensions(80, 1500, 64, 2, 2, 51864, 448, 64, 2, 2)
    model = Whisper(dims, mx.float32)
    flat = nn.utils.tree_flatten(model.parameters())
    model.update(nn.utils.tree_unflatten([(k, mx.random.normal(v.shape) * 0.2) for k, v in flat]))
    model.decoder.positional_embedding = mx.random.normal((448, 64)) * 0.1
    mx.eval(model.parameters())
    encoding = load_encoding(artifact_dir, model.num_languages, dims.n_vocab)
    mel = pad_or_trim(log_mel_spectrogram(FOX, n_mels=80), N_FRAMES, axis=-2)
    return model, encoding, mel


def test_fused_encoder_and_cross_kv_match_the_faithful_model(small) -> None:
    model, _, mel = small
    fast = FastWhisper(model)
    expected = model.embed_audio(mel[None])
    got = fast.embed_audio(mel[None])
    assert float(mx.abs(expected - got).max()) < ENCODER_TOLERANCE
    cross = fast.cross_kv(expected)
    for block, (k, v) in zip(model.decoder.blocks, cross, strict=True):
        want_k = block.cross_attn.key(expected).reshape(1, 1500, 2, 32).transpose(0, 2, 1, 3)
        want_v = block.cross_attn.value(expected).reshape(1, 1500, 2, 32).transpose(0, 2, 1, 3)
        assert float(mx.abs(want_k - k).max()) < ENCODER_TOLERANCE
        assert float(mx.abs(want_v - v).max()) < ENCODER_TOLERANCE

    # The same check catches a q|k|v fusion in the wrong order (k and v swapped).
    wrong = FastWhisper(model)
    wrong._encoder_qkv = [(mx.concatenate([w[:64], w[128:], w[64:128]]), b) for w, b in wrong._encoder_qkv]
    assert float(mx.abs(expected - wrong._encoder_forward(mel[None])).max()) > 100 * ENCODER_TOLERANCE


def _prefixes(begin: int, eot: int) -> list[list[int]]:
    text = 440
    return [
        [],
        [begin],  # a pair open
        [begin, text],
        [begin, text, begin + 30],  # open again
        [begin, text, begin + 30, begin + 30],  # pair closed
        [begin + 2, text, text, begin + 40, begin + 41, text],
        [text, text],
        [begin + 10, begin + 10, text, begin + 5],  # a going-back timestamp (monotonic rule)
    ]


@pytest.mark.parametrize(
    "options",
    [
        DecodingOptions(language="en", fp16=False),
        DecodingOptions(language="en", fp16=False, fix_monotonic_timestamps=True, max_initial_timestamp=None),
        DecodingOptions(language="en", fp16=False, suppress_blank=False, suppress_tokens=""),
        DecodingOptions(language="en", fp16=False, without_timestamps=True),
    ],
    ids=["default", "monotonic-no-initial-limit", "no-blank-no-suppress", "without-timestamps"],
)
def test_array_filters_equal_decoding_filters_bit_for_bit(small, options) -> None:
    model, encoding, _ = small
    task = DecodingTask(model, options, encoding)
    fast = FastFilters.from_decoding(task.logit_filters, model.dims.n_vocab)
    tokenizer = task.tokenizer
    begin = tokenizer.timestamp_begin
    rng = np.random.default_rng(1)
    for prefix in _prefixes(begin, tokenizer.eot):
        for boost in (0.0, 6.0):  # without and with the timestamps' mass winning over text
            logits = rng.normal(size=(2, model.dims.n_vocab)).astype(np.float32)
            logits[:, begin:] += boost
            tokens = mx.array([list(task.initial_tokens) + prefix] * 2)
            expected = mx.array(logits)
            for f in task.logit_filters:
                expected = f.apply(expected, tokens)
            got = fast.apply(mx.array(logits), FilterState.from_sampled([prefix] * 2, begin))
            e, g = np.array(expected), np.array(got)
            assert np.array_equal(np.isneginf(e), np.isneginf(g)), (prefix, boost)
            assert np.array_equal(raw_bits(e), raw_bits(g)), (prefix, boost)

    # A filter list the fast path does not know is refused by name.
    with pytest.raises(TypeError, match="no array form"):
        FastFilters.from_decoding([object()], model.dims.n_vocab)


class _Steps(DecodeObserver):
    def __init__(self) -> None:
        self.rows: list[tuple[np.ndarray, list[int], bool]] = []

    def on_step(self, logits, tokens, kept) -> None:
        self.rows.append((np.array(logits), tokens.tolist(), kept))


def test_fast_greedy_decode_follows_the_faithful_decoder(small) -> None:
    model, encoding, mel = small
    fast = FastWhisper(model)
    options = DecodingOptions(language="en", fp16=False, sample_len=24)
    seen_faithful, seen_fast = _Steps(), _Steps()
    want = decode(model, mel, encoding, options, observer=seen_faithful)
    got = fast_decode(fast, mel, encoding, options, observer=seen_fast)
    assert got.tokens == want.tokens and got.text == want.text
    assert [(t, k) for _, t, k in seen_fast.rows] == [(t, k) for _, t, k in seen_faithful.rows]
    assert abs(got.avg_logprob - want.avg_logprob) < 1e-4 or (np.isnan(got.avg_logprob) and np.isnan(want.avg_logprob))
    assert abs(got.no_speech_prob - want.no_speech_prob) < 1e-4

    # Teacher forcing: fed other tokens, the observer reports the forced tokens.
    forced = [[tokenizer_token for tokenizer_token in want.tokens[:3]] + [50364]]
    forced_seen = _Steps()
    fast_decode(fast, mel, encoding, options, observer=forced_seen, forced_tokens=forced)
    assert [t[0] for _, t, k in forced_seen.rows if k][:4] == forced[0]

    # Not a FastWhisper: a clear error.
    with pytest.raises(TypeError, match="FastWhisper"):
        fast_decode(model, mel, encoding, options)


# -- the L2 gate on the real fast path -------------------------------------------------------


@pytest.fixture(scope="module")
def fox_case(artifact_dir):
    """fox-fast's full golden, its tracked calibration record, the real model and options."""
    from harness.session import ParitySession
    from models.whisper.load import load_model

    session = ParitySession()
    profile = session.profile(MODEL)
    scenario = profile.scenario("fox-fast")
    golden = session.full_golden(profile, scenario)  # every step's full logits (not a compact golden)
    calibration = session.calibration(profile, scenario, golden)
    budget = int(scenario.composition["budget"]["max_differing_tokens"])
    model = load_model(artifact_dir, dtype=mx.float32)
    options = dict(profile.scenario_spec(scenario)["options"])
    return golden, calibration, budget, model, artifact_dir, options


def _records(fox_case, fast: FastWhisper, max_steps: int | None = None) -> tuple[ScenarioRecord, ScenarioRecord]:
    """Free and teacher-forced fast records; `max_steps` caps a perturbed run's steps per window
    (a broken model babbles to the 224-step limit: slow on this CPU, and no more informative)."""
    golden, _, _, _, model_dir, options = fox_case
    if max_steps is not None:
        options = options | {"sample_len": max_steps}
    out = []
    for forced in (None, golden.extra["decode_calls"]):
        rec = fast_transcribe_record(fast, model_dir, FOX, options, forced=forced)
        out.append(
            ScenarioRecord(
                scenario_id="fox-fast",
                rendered_prompt=None,
                prompt_ids=[],
                tokens=rec["tokens"],
                logits=rec["logits"],
                eos_ids=rec["eos_ids"],
                mode="free" if forced is None else "teacher_forced",
                extra={"decode_calls": rec["decode_calls"], "transcript": rec["transcript"]},
            )
        )
    return out[0], out[1]


@pytest.fixture(scope="module")
def fox_fast_records(fox_case):
    return _records(fox_case, fast_model.as_fast(fox_case[3]))


def test_the_gate_passes_the_real_fast_path_on_fox(fox_case, fox_fast_records) -> None:
    golden, calibration, budget = fox_case[:3]
    free, forced = fox_fast_records
    result = check_token_budget(golden, free, forced, budget, calibration)
    assert result.passed, result.summary
    assert result.steps_compared == golden.extra["decode_calls"][0]["n_steps"]
    assert result.details["max_abs_logit_error"] > 0  # not bit-exact: the L2 path really differs
    # The record is the fast path's own measurement on this key: reproduced exactly, step by step.
    assert measure(golden, forced)["steps"] == list(calibration.steps)


def test_the_gate_fails_a_budget_edited_away_from_its_record(fox_case, fox_fast_records) -> None:
    golden, calibration, budget = fox_case[:3]
    result = check_token_budget(golden, *fox_fast_records, budget + 5, calibration)
    assert not result.passed
    assert f"budget is {budget + 5} differing tokens, its calibration record says {budget}" in result.summary


def _fresh_fast(fox_case, share_encoder: bool) -> FastWhisper:
    """A new FastWhisper (nothing compiled yet); with `share_encoder`, it starts from the real
    fast path's audio features of fox (its encoder is not what the perturbation changes)."""
    fast = FastWhisper(fox_case[3])
    if share_encoder:
        fast._features_memo = fast_model.as_fast(fox_case[3])._features_memo
    return fast


def _assert_caught_by_the_bound(fox_case, free: ScenarioRecord, forced: ScenarioRecord) -> None:
    golden, calibration, budget = fox_case[:3]
    result = check_token_budget(golden, free, forced, budget, calibration)
    assert not result.passed
    assert "exceeds its calibrated bound" in result.summary, result.summary
    assert result.details["steps_over_bound"]


def test_the_gate_fails_a_fast_path_whose_logits_are_scaled_by_1_01(fox_case, fox_fast_records) -> None:
    fast = _fresh_fast(fox_case, share_encoder=True)
    fast._logits = lambda x: FastWhisper._logits(fast, x) * 1.01  # the argmax is unchanged
    free, forced = _records(fox_case, fast, max_steps=20)
    _assert_caught_by_the_bound(fox_case, free, forced)
    # The tokens are the real fast path's: a budget and near-ties alone would have passed it.
    assert free.tokens == fox_fast_records[0].tokens


def test_the_gate_fails_an_attention_scale_one_ulp_off(fox_case) -> None:
    fast = _fresh_fast(fox_case, share_encoder=False)
    for name in ("audio_attention_scale", "text_attention_scale"):
        scale = np.float32(getattr(fast, name))
        setattr(fast, name, float(np.nextafter(scale, np.float32(np.inf))))
    free, forced = _records(fox_case, fast, max_steps=20)
    _assert_caught_by_the_bound(fox_case, free, forced)


def test_the_gate_fails_a_compiled_step_without_its_timestamp_rules(fox_case, monkeypatch) -> None:
    golden, calibration, budget = fox_case[:3]

    class NoTimestampRules(fast_model._Chooser):
        def __init__(self, filters, forcing, eot):
            super().__init__(replace(filters, timestamps=None), forcing, eot)

    monkeypatch.setattr(fast_model, "_Chooser", NoTimestampRules)
    free, forced = _records(fox_case, _fresh_fast(fox_case, share_encoder=True), max_steps=20)
    result = check_token_budget(golden, free, forced, budget, calibration)
    assert not result.passed
    assert "compiled step's rules differ from its filters" in result.summary, result.summary


# -- the gate on synthetic records ---------------------------------------------------------

VOCAB, EOT = 8, 7
FILTERS = FastFilters(n_vocab=VOCAB, blank=None, suppress=(6,), timestamps=None).to_dict()


def _record(tokens: list[int], logits: np.ndarray, mode: str, picks: list[int] | None = None) -> ScenarioRecord:
    call = {
        "seek": 0,
        "batch": 1,
        "n_steps": len(tokens),
        "row_offset": 0,
        "tokens": [t for t in tokens if t != EOT],
        "kept": True,
        "skipped_as_silence": False,
        "temperature": 0.0,
    }
    if picks is not None:
        call |= {"fast_filters": FILTERS, "fast_picks": [[p] for p in picks]}
    return ScenarioRecord(
        "synthetic", None, [], tokens, logits.astype(np.float32), [EOT], mode, extra={"decode_calls": [call]}
    )


def _logits(rows: list[dict[int, float]]) -> np.ndarray:
    out = np.zeros((len(rows), VOCAB), np.float32)
    for i, row in enumerate(rows):
        for token, value in row.items():
            out[i, token] = value
    return out


def _calibrated(golden: ScenarioRecord, forced: ScenarioRecord, budget: int) -> CalibrationRecord:
    """The record `make calibrate` would write for this fast path (its own measurement)."""
    steps = tuple(measure(golden, forced)["steps"])
    return CalibrationRecord("synthetic", "synthetic", "key", golden_identity(golden), budget, steps, {})


ORACLE = _logits([{2: 5.0, 3: 1.0}, {4: 3.0, 5: 2.999}, {EOT: 9.0}])
NEAR_TIE = _logits([{2: 5.0, 3: 1.0}, {4: 2.999, 5: 3.0}, {EOT: 9.0}])


def test_a_near_tie_flip_within_budget_passes_and_budget_zero_fails() -> None:
    golden = _record([2, 4, EOT], ORACLE, "free")
    free = _record([2, 5, EOT], NEAR_TIE, "free")
    forced = _record([2, 4, EOT], NEAR_TIE, "teacher_forced", picks=[2, 5, EOT])
    ok = check_token_budget(golden, free, forced, 1, _calibrated(golden, forced, 1))
    assert ok.passed and ok.details["flips"][0]["near_tie"], ok.summary
    assert "decode call 0 step 1" in ok.summary and "arises at decode call 0 step 1" in ok.summary
    tight = check_token_budget(golden, free, forced, 0, _calibrated(golden, forced, 0))
    assert not tight.passed and "1 differing tokens over the budget of 0" in tight.summary


def test_a_wide_margin_flip_is_rejected_whatever_the_budget() -> None:
    golden = _record([2, 4, EOT], ORACLE, "free")
    fast_logits = _logits([{2: 5.0, 3: 1.0}, {4: 3.0, 3: 0.5}, {EOT: 9.0}])  # 4 still far ahead
    forced = _record([2, 4, EOT], fast_logits, "teacher_forced", picks=[2, 3, EOT])
    free = _record([2, 3, EOT], fast_logits, "free")
    result = check_token_budget(golden, free, forced, 5, _calibrated(golden, forced, 5))
    assert not result.passed
    assert "NOT a near-tie" in result.summary and "oracle 4 vs fast 3" in result.summary, result.summary


def test_a_flip_onto_a_suppressed_token_is_not_a_near_tie() -> None:
    golden = _record([2, 4, EOT], ORACLE, "free")
    fast_logits = _logits([{2: 5.0, 3: 1.0}, {4: 3.0, 6: 3.5}, {EOT: 9.0}])
    forced = _record([2, 4, EOT], fast_logits, "teacher_forced", picks=[2, 6, EOT])
    free = _record([2, 6, EOT], fast_logits, "free")
    result = check_token_budget(golden, free, forced, 5, _calibrated(golden, forced, 5))
    assert not result.passed and "forbid" in result.summary, result.summary


def test_a_logit_error_over_its_recorded_bound_fails_at_that_step() -> None:
    golden = _record([2, 4, EOT], ORACLE, "free")
    recorded = _logits([{2: 5.0, 3: 1.0}, {4: 3.0, 5: 2.999, 0: 1e-5}, {EOT: 9.0}])
    calibration = _calibrated(golden, _record([2, 4, EOT], recorded, "teacher_forced", [2, 4, EOT]), 0)
    free = _record([2, 4, EOT], ORACLE, "free")
    for value, passes in ((1e-5, True), (5e-6, True), (2e-5, False)):  # equal, smaller, larger error
        fast = _logits([{2: 5.0, 3: 1.0}, {4: 3.0, 5: 2.999, 0: value}, {EOT: 9.0}])
        result = check_token_budget(
            golden, free, _record([2, 4, EOT], fast, "teacher_forced", [2, 4, EOT]), 0, calibration
        )
        assert result.passed is passes, result.summary
    assert "decode call 0 step 1: 2e-05 > 1e-05" in result.summary, result.summary


def test_a_run_the_fast_path_never_decoded_fails() -> None:
    """Every call delegated to the faithful decoder (no picks): nothing of the fast path judged."""
    golden = _record([2, 4, EOT], ORACLE, "free")
    forced = _record([2, 4, EOT], ORACLE, "teacher_forced")  # no fast_picks: delegated
    result = check_token_budget(golden, golden, forced, 0, _calibrated(golden, forced, 0))
    assert not result.passed and "decoded no greedy step" in result.summary, result.summary


def test_a_free_run_that_differs_where_teacher_forcing_agrees_is_unexplained() -> None:
    """The free run flips at step 1 but, fed the same prefix, the fast path picks the oracle's
    token: the difference is not a near-tie of this fast path, whatever the budget."""
    golden = _record([2, 4, EOT], ORACLE, "free")
    free = _record([2, 5, EOT], NEAR_TIE, "free")
    forced = _record([2, 4, EOT], ORACLE, "teacher_forced", picks=[2, 4, EOT])
    result = check_token_budget(golden, free, forced, 5, _calibrated(golden, forced, 5))
    assert not result.passed
    assert "first differs at decode call 0 step 1" in result.summary and "disagree" in result.summary


def test_differences_after_the_first_follow_from_it() -> None:
    """A near-tie flip at step 1, then a different continuation: all counted, all attributed."""
    oracle = _logits([{2: 5.0}, {4: 3.0, 5: 2.999}, {3: 4.0}, {EOT: 9.0}])
    fast = _logits([{2: 5.0}, {4: 2.999, 5: 3.0}, {3: 4.0}, {EOT: 9.0}])
    golden = _record([2, 4, 3, EOT], oracle, "free")
    forced = _record([2, 4, 3, EOT], fast, "teacher_forced", picks=[2, 5, 3, EOT])
    free = _record([2, 5, 1, 1, EOT], np.vstack([fast[:2], fast[1:2], fast[1:2], fast[3:]]), "free")
    result = check_token_budget(golden, free, forced, 3, _calibrated(golden, forced, 3))
    assert result.passed, result.summary
    assert result.details["differing_tokens"] == 3 and result.details["arising"]["step"] == 1


def test_token_differences_counts_spans() -> None:
    assert token_differences([1, 2, 3], [1, 2, 3])[0] == 0
    assert token_differences([1, 2, 3, 9], [1, 2, 4, 5, 9])[0] == 2  # "dog" -> "dog." + timestamp
    assert token_differences([1, 2], [])[0] == 2
