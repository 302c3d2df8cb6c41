"""In-tree Whisper decoding stages: tokenizer ids, logit filters, decoder, ranker, fallback
and segment rules, the decode loop and the seek loop, on synthetic vocabularies and a
scripted fake model (no weights). Bit parity with mlx-whisper on real weights is the
harness's job; these pin the rules that decide its tokens. The special-token layout is
compared with what mlx-whisper's own get_tokenizer computes, run in its oracle venv.
"""

from __future__ import annotations

import base64
import json
import math
import zlib
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from harness.runners.whisper_record import TranscriptionRecorder, fallback_reasons
from models.whisper import decoding, tokenizer
from models.whisper.decoding import DecodingTask
from models.whisper.decoding_types import DecodingOptions, DecodingResult, compression_ratio
from models.whisper.fallback import needs_fallback, should_skip
from models.whisper.hooks import DecodeObserver, ForcedCall
from models.whisper.logit_filters import ApplyTimestampRules, SuppressBlank, SuppressTokens
from models.whisper.seek_loop import parse_clip_timestamps
from models.whisper.segments import split_segments
from models.whisper.token_decoders import GreedyDecoder, MaximumLikelihoodRanker
from models.whisper.transcribe import transcribe
from tests.oracle_call import oracle_answer

NEG_INF = -math.inf


# --------------------------------------------------------------------------- vocabularies


def synthetic_ranks(n: int) -> dict[bytes, int]:
    """`n` byte-pair ranks: the 256 single bytes, then distinct two-byte tokens."""
    ranks = {bytes([b]): b for b in range(256)}
    for i in range(n - 256):
        ranks[bytes([32 + i % 95, 33 + (i // 95) % 94]) + bytes([65 + i // (95 * 94)] * (i >= 95 * 94))] = 256 + i
    assert len(ranks) == n
    return ranks


@pytest.fixture(scope="module")
def small_tokenizer() -> tokenizer.Tokenizer:
    """English-only layout over the 256 bytes: eot 256, sot 257, timestamps from 264."""
    encoding = tokenizer.build_encoding(synthetic_ranks(256), num_languages=0)
    return tokenizer.get_tokenizer(encoding, multilingual=False, num_languages=0)


# mlx-whisper's get_tokenizer, run in its oracle venv: the special-token layout of each case
# below, read attribute by attribute. Each case names the vocabulary mlx-whisper picks
# (gpt2.tiktoken English-only, multilingual.tiktoken otherwise) and its arguments; the in-tree
# side builds its encoding from those same asset files and is compared field by field.
TOKENIZER_CASES: dict[str, dict] = {
    # tiny.en's layout: an English-only model ignores a language and a task.
    "english-only": {"multilingual": False, "num_languages": 99, "language": "fr", "task": "translate"},
    # tiny, base, ... large-v2: 99 languages.
    "multilingual-99": {"multilingual": True, "num_languages": 99},
    # large-v3: 100 languages; by default English transcription ...
    "multilingual-100": {"multilingual": True, "num_languages": 100},
    # ... a language by name, translation ...
    "multilingual-100-french": {"multilingual": True, "num_languages": 100, "language": "French", "task": "translate"},
    # ... and a language neither a code nor a name.
    "multilingual-100-klingon": {"multilingual": True, "num_languages": 100, "language": "klingon"},
}
TOKENIZER_FIELDS = (
    "language",
    "task",
    "eot",
    "sot",
    "translate",
    "transcribe",
    "sot_lm",
    "sot_prev",
    "no_speech",
    "no_timestamps",
    "timestamp_begin",
    "sot_sequence",
    "sot_sequence_including_notimestamps",
    "all_language_tokens",
    "all_language_codes",
    "non_speech_tokens",
    "special_tokens",
)

# The tests that read the oracle's answer share one worker under `make test` (-n, loadgroup),
# so the module-scoped fixture starts the oracle venv once.
ORACLE_GROUP = pytest.mark.xdist_group("oracle-mlx-whisper-tokenizers")

ORACLE_TOKENIZERS = """
import json, os, sys
from mlx_whisper import tokenizer as T

job = json.load(open(sys.argv[1]))

def attempt(f, *args):
    try:
        value = f(*args)
    except (KeyError, ValueError) as exc:
        return {"raises": type(exc).__name__, "message": str(exc)}
    return list(value) if isinstance(value, tuple) else value

out = {
    "assets": os.path.join(os.path.dirname(T.__file__), "assets"),
    "languages": T.LANGUAGES,
    "to_language_code": T.TO_LANGUAGE_CODE,
    "tokenizers": {},
}
for name, case in job["cases"].items():
    args = {k: case[k] for k in ("num_languages", "language", "task") if k in case}
    tok = attempt(lambda: T.get_tokenizer(case["multilingual"], **args))
    if isinstance(tok, dict):  # get_tokenizer raised
        out["tokenizers"][name] = tok
        continue
    fields = {f: attempt(getattr, tok, f) for f in job["fields"]}
    fields["vocabulary"] = tok.encoding.name
    fields["n_vocab"] = tok.encoding.n_vocab
    fields["language_token"] = attempt(getattr, tok, "language_token")
    fields["to_language_token"] = {code: attempt(tok.to_language_token, code) for code in T.LANGUAGES}
    out["tokenizers"][name] = fields
json.dump(out, open(sys.argv[2], "w"))
"""


@pytest.fixture(scope="module")
def mlx_whisper_tokenizers(tmp_path_factory) -> dict:
    """mlx-whisper's answer for every case of TOKENIZER_CASES (one oracle venv start)."""
    job = {"cases": TOKENIZER_CASES, "fields": TOKENIZER_FIELDS}
    return oracle_answer("mlx-whisper", ORACLE_TOKENIZERS, job, tmp_path_factory.mktemp("mlx-whisper-tokenizers"))


@pytest.fixture(scope="module")
def vocabularies(mlx_whisper_tokenizers: dict, tmp_path_factory) -> dict[bool, Path]:
    """multilingual -> a model directory holding (a link to) the vocabulary file mlx-whisper's
    get_tokenizer reads: gpt2.tiktoken for English-only models, multilingual.tiktoken else."""
    assets = Path(mlx_whisper_tokenizers["assets"])
    root = tmp_path_factory.mktemp("whisper-vocabularies")
    dirs = {}
    for multilingual, name in ((False, "gpt2"), (True, "multilingual")):
        (root / name).mkdir()
        (root / name / f"{name}.tiktoken").symlink_to(assets / f"{name}.tiktoken")
        dirs[multilingual] = root / name
    return dirs


def _attempt(f, *args):
    """As the oracle script records a value: a raised KeyError/ValueError as its type and message."""
    try:
        value = f(*args)
    except (KeyError, ValueError) as exc:
        return {"raises": type(exc).__name__, "message": str(exc)}
    return list(value) if isinstance(value, tuple) else value


def in_tree_tokenizer_record(case: dict, vocabularies: dict[bool, Path], codes: list[str]) -> dict:
    """The in-tree tokenizer of `case`, on the vocabulary file mlx-whisper reads for it, recorded
    as the oracle script records mlx-whisper's (the same fields, errors as type and message)."""
    model_dir = vocabularies[case["multilingual"]]
    encoding = tokenizer.load_encoding(model_dir, case["num_languages"])
    args = {k: case[k] for k in ("language", "task") if k in case}
    tok = _attempt(
        lambda: tokenizer.get_tokenizer(
            encoding, multilingual=case["multilingual"], num_languages=case["num_languages"], **args
        )
    )
    if isinstance(tok, dict):
        return tok
    record = {f: _attempt(getattr, tok, f) for f in TOKENIZER_FIELDS}
    record["vocabulary"] = next(model_dir.glob("*.tiktoken")).name
    record["n_vocab"] = encoding.n_vocab
    record["language_token"] = _attempt(getattr, tok, "language_token")
    record["to_language_token"] = {code: _attempt(tok.to_language_token, code) for code in codes}
    return record


def _comparable(record: dict) -> dict:
    """A new dict of `record` as tokenizer_differences compares it (`record` is left unchanged)."""
    if "all_language_tokens" not in record:  # get_tokenizer raised: compared whole
        return dict(record)

    def lookup(value):
        return {"raises": value["raises"]} if isinstance(value, dict) else value

    comparable = {f: v for f, v in record.items() if f not in ("all_language_tokens", "all_language_codes")}
    pairs = zip(record["all_language_tokens"], record["all_language_codes"], strict=True)
    comparable["language_pairs"] = sorted(map(list, pairs))
    comparable["language_token"] = lookup(record["language_token"])
    comparable["to_language_token"] = {code: lookup(v) for code, v in record["to_language_token"].items()}
    return comparable


def tokenizer_differences(mine: dict, theirs: dict) -> dict[str, tuple]:
    """Fields whose in-tree value differs from mlx-whisper's: {field: (in-tree, mlx-whisper)}.

    Where the two sides differ on purpose, what is compared is what both promise:
    - all_language_tokens / all_language_codes: mlx-whisper lists them in the (hash-seeded)
      iteration order of tiktoken's special-token set, the in-tree side in id order (see its
      docstring): compared as the set of (token, code) pairs;
    - a failed language lookup (language_token with no language, to_language_token of a
      language the vocabulary lacks): the same exception type, the in-tree side words it its
      own way. get_tokenizer's "Unsupported language" error is compared whole.
    """
    mine, theirs = _comparable(mine), _comparable(theirs)
    return {
        field: (mine.get(field, "<missing>"), theirs.get(field, "<missing>"))
        for field in sorted(mine.keys() | theirs.keys())
        if mine.get(field, "<missing>") != theirs.get(field, "<missing>")
    }


def _abridged(differences: dict[str, tuple]) -> dict[str, tuple]:
    return {f: tuple(repr(v)[:300] for v in pair) for f, pair in differences.items()}


@ORACLE_GROUP
@pytest.mark.parametrize("case", list(TOKENIZER_CASES))
def test_special_ids_equal_mlx_whisper(case: str, mlx_whisper_tokenizers: dict, vocabularies) -> None:
    theirs = mlx_whisper_tokenizers["tokenizers"][case]
    # Every case builds a tokenizer but the one naming an unknown language (no vacuous match).
    assert ("raises" in theirs) == (case == "multilingual-100-klingon"), theirs
    mine = in_tree_tokenizer_record(TOKENIZER_CASES[case], vocabularies, list(mlx_whisper_tokenizers["languages"]))
    differences = tokenizer_differences(mine, theirs)
    assert not differences, _abridged(differences)


@ORACLE_GROUP
def test_language_tables_equal_mlx_whisper(mlx_whisper_tokenizers: dict) -> None:
    # The code order decides the language token ids; names and aliases what a language argument may be.
    assert list(tokenizer.LANGUAGES.items()) == list(mlx_whisper_tokenizers["languages"].items())
    assert tokenizer.TO_LANGUAGE_CODE == mlx_whisper_tokenizers["to_language_code"]


@pytest.fixture
def fresh_tokenizer_caches():
    """Empty the in-tree encoding and tokenizer caches before and after (a perturbed layout
    must neither reuse nor leave behind a cached encoding)."""
    tokenizer._cached_encoding.cache_clear()
    tokenizer._shared_tokenizer.cache_clear()
    yield
    tokenizer._cached_encoding.cache_clear()
    tokenizer._shared_tokenizer.cache_clear()


@ORACLE_GROUP
def test_special_ids_comparison_fails_on_a_perturbed_in_tree_layout(
    mlx_whisper_tokenizers: dict, vocabularies, fresh_tokenizer_caches, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The comparison above can fail: swapping two in-tree task tokens is caught field by field."""
    tasks = list(tokenizer._TASK_TOKENS)
    i, j = tasks.index("<|nospeech|>"), tasks.index("<|notimestamps|>")
    tasks[i], tasks[j] = tasks[j], tasks[i]
    monkeypatch.setattr(tokenizer, "_TASK_TOKENS", tuple(tasks))
    codes = list(mlx_whisper_tokenizers["languages"])
    for case in ("english-only", "multilingual-100"):
        mine = in_tree_tokenizer_record(TOKENIZER_CASES[case], vocabularies, codes)
        differences = tokenizer_differences(mine, mlx_whisper_tokenizers["tokenizers"][case])
        assert {"no_speech", "no_timestamps", "sot_sequence_including_notimestamps", "special_tokens"} <= set(
            differences
        ), case


def test_get_tokenizer_is_built_once_per_encoding_language_and_task():
    """Every decode call asks for its tokenizer: the same arguments give the same object (as
    mlx-whisper caches get_tokenizer), other arguments or another encoding a new one."""
    encoding = tokenizer.build_encoding(synthetic_ranks(256), num_languages=0)
    first = tokenizer.get_tokenizer(encoding, multilingual=False, num_languages=0)
    assert tokenizer.get_tokenizer(encoding, multilingual=False, num_languages=0) is first
    # an English-only model has no language or task token: asking for one changes nothing
    assert tokenizer.get_tokenizer(encoding, multilingual=False, num_languages=0, language="fr") is first
    other = tokenizer.build_encoding(synthetic_ranks(256), num_languages=0)
    assert tokenizer.get_tokenizer(other, multilingual=False, num_languages=0) is not first


def _byte_level(token: bytes) -> str:
    to_char = {b: c for c, b in tokenizer._byte_level_decoder().items()}
    return "".join(to_char[b] for b in token)


def test_vocabulary_files_give_the_same_ranks(tmp_path):
    ranks = synthetic_ranks(300)
    ordered = sorted(ranks, key=ranks.get)
    (tmp_path / "tk").mkdir()
    (tmp_path / "tk" / "gpt2.tiktoken").write_text(
        "".join(f"{base64.b64encode(t).decode()} {ranks[t]}\n" for t in ordered)
    )
    (tmp_path / "ct2").mkdir()
    specials = tokenizer.special_token_names(99)
    (tmp_path / "ct2" / "vocabulary.txt").write_text("\n".join([*(_byte_level(t) for t in ordered), *specials]))
    (tmp_path / "hf").mkdir()
    vocab = {_byte_level(t): ranks[t] for t in ordered} | {"<|endoftext|>": len(ranks)}
    (tmp_path / "hf" / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab}}))
    for name in ("tk", "ct2", "hf"):
        assert tokenizer.read_ranks(tmp_path / name) == ranks, name
    with pytest.raises(ValueError, match="vocabulary of 1908 tokens"):
        tokenizer.load_encoding(tmp_path / "tk", 99, n_vocab=51864)


def test_text_round_trips_and_timestamps_are_dropped_by_decode(small_tokenizer):
    tok = small_tokenizer
    ids = tok.encode(" The fox, 3.14!")
    assert tok.decode(ids) == " The fox, 3.14!"
    assert tok.decode([tok.timestamp_begin, *ids, tok.timestamp_begin + 50]) == " The fox, 3.14!"
    assert tok.decode_with_timestamps([tok.timestamp_begin + 50]) == "<|1.00|>"
    non_speech = set(tok.non_speech_tokens)
    assert tok.encode(" -")[0] in non_speech and tok.encode("[")[0] in non_speech
    assert tok.encode(".")[0] not in non_speech and tok.encode(",")[0] not in non_speech


# --------------------------------------------------------------------------- logit filters


def row(tok: tokenizer.Tokenizer, values: dict[int, float], default: float = 0.0) -> mx.array:
    logits = np.full((1, tok.encoding.n_vocab), default, np.float32)
    for token, value in values.items():
        logits[0, token] = value
    return mx.array(logits)


def masked(logits: mx.array) -> set[int]:
    return set(np.flatnonzero(np.isneginf(np.array(logits[0]))).tolist())


def test_suppress_blank_only_at_the_first_sampled_position(small_tokenizer):
    tok = small_tokenizer
    blank = SuppressBlank(tok, sample_begin=3, n_vocab=tok.encoding.n_vocab)
    logits = row(tok, {})
    assert masked(blank.apply(logits, mx.array([[1, 2, 3]]))) == {*tok.encode(" "), tok.eot}
    assert masked(blank.apply(logits, mx.array([[1, 2, 3, 4]]))) == set()


def test_suppress_tokens_every_step(small_tokenizer):
    tok = small_tokenizer
    suppress = SuppressTokens([5, 7, tok.no_speech], tok.encoding.n_vocab)
    assert masked(suppress.apply(row(tok, {}), mx.array([[1, 2, 3, 4]]))) == {5, 7, tok.no_speech}


def test_timestamp_rules_first_token_is_an_early_timestamp(small_tokenizer):
    tok = small_tokenizer
    tb = tok.timestamp_begin
    rules = ApplyTimestampRules(tok, sample_begin=1, max_initial_timestamp_index=50)
    out = masked(rules.apply(row(tok, {}), mx.array([[tok.sot]])))
    allowed = set(range(tok.encoding.n_vocab)) - out
    assert allowed == set(range(tb, tb + 51))


def test_timestamp_rules_pairs(small_tokenizer):
    tok = small_tokenizer
    tb = tok.timestamp_begin
    rules = ApplyTimestampRules(tok, sample_begin=1, max_initial_timestamp_index=None)
    n_vocab = tok.encoding.n_vocab
    logits = row(tok, {65: 12.0})  # a clear text favourite, so the probability rule stays out
    # timestamp, text, timestamp: a pair is open -> only timestamps or EOT
    open_pair = masked(rules.apply(logits, mx.array([[tok.sot, tb, 65, tb + 10]])))
    assert open_pair == set(range(tok.eot)) | {tok.no_timestamps}
    # ... timestamp, timestamp: a pair just closed -> no timestamp
    closed = masked(rules.apply(logits, mx.array([[tok.sot, tb, 65, tb + 10, tb + 10]])))
    assert closed == set(range(tb, n_vocab)) | {tok.no_timestamps}
    # text last: anything but <|notimestamps|>
    assert masked(rules.apply(logits, mx.array([[tok.sot, tb, 65]]))) == {tok.no_timestamps}


def test_timestamp_rules_force_a_timestamp_when_timestamps_are_likelier(small_tokenizer):
    tok = small_tokenizer
    tb = tok.timestamp_begin
    rules = ApplyTimestampRules(tok, sample_begin=1, max_initial_timestamp_index=None)
    tokens = mx.array([[tok.sot, tb, 65]])
    # 1501 timestamps at 0 against text at 0 (and one text token at 5): timestamps win
    forced = masked(rules.apply(row(tok, {65: 5.0}, default=0.0), tokens))
    assert set(range(tb)) <= forced
    text_wins = masked(rules.apply(row(tok, {65: 12.0}, default=0.0), tokens))
    assert text_wins == {tok.no_timestamps}


def test_monotonic_rule_is_off_as_in_mlx_whisper_and_on_when_fixed(small_tokenizer):
    tok = small_tokenizer
    tb = tok.timestamp_begin
    tokens = mx.array([[tok.sot, tb + 20, 65, tb + 30, tb + 30, 66]])
    logits = row(tok, {66: 9.0})
    faithful = ApplyTimestampRules(tok, sample_begin=1, max_initial_timestamp_index=None)
    assert not masked(faithful.apply(logits, tokens)) & set(range(tb, tb + 31))
    fixed = ApplyTimestampRules(tok, sample_begin=1, max_initial_timestamp_index=None, fix_monotonic_timestamps=True)
    assert set(range(tb, tb + 31)) <= masked(fixed.apply(logits, tokens))  # 0.00 .. 0.60 forbidden
    # an open pair may close on the same timestamp (openai-whisper keeps timestamps[-1] itself)
    open_pair = mx.array([[tok.sot, tb + 20, 65, tb + 30, tb + 30, 66, tb + 40]])
    assert set(range(tb, tb + 40)) <= masked(fixed.apply(logits, open_pair))


def test_filter_order_changes_the_choice(small_tokenizer):
    """SuppressTokens before ApplyTimestampRules (mlx-whisper's order) makes the timestamp
    probability rule compare against the remaining text tokens; the other order lets a
    suppressed token's logit keep timestamps out. A swapped order must change the pick."""
    tok = small_tokenizer
    tb = tok.timestamp_begin
    n_vocab = tok.encoding.n_vocab
    tokens = mx.array([[tok.sot, tb, 65]])
    values = np.full((1, n_vocab), -5.0, np.float32)
    values[0, tb:] = 0.0  # the timestamps together: log(1501) = 7.3
    values[0, 66], values[0, 67] = 9.0, 3.0
    logits = mx.array(values)
    suppress = SuppressTokens([66], n_vocab)
    rules = ApplyTimestampRules(tok, sample_begin=1, max_initial_timestamp_index=None)

    in_order = rules.apply(suppress.apply(logits, tokens), tokens)
    swapped = suppress.apply(rules.apply(logits, tokens), tokens)
    assert in_order.argmax().item() == tb  # 66 gone, 67 (3.0) loses to the timestamps
    assert swapped.argmax().item() == 67  # 66 (9.0) kept text allowed, then was suppressed


def reference_timestamp_rules(
    tok: tokenizer.Tokenizer,
    logits: mx.array,
    tokens: mx.array,
    sample_begin: int,
    max_initial_timestamp_index: int | None,
    monotonic: bool,
    openai: bool,
) -> mx.array:
    """mlx-whisper 0.4.3's ApplyTimestampRules.apply as it is written (the token list read back,
    a numpy mask built row by row), with openai-whisper's monotonic rule and post-mask
    comparison when asked: the reference the device-side filter must equal bit for bit."""
    tb, eot = tok.timestamp_begin, tok.eot
    mask = np.zeros(logits.shape, np.float32)
    mask[:, tok.no_timestamps] = -np.inf
    rows = tokens.tolist()
    for k, row_tokens in enumerate(rows):
        seq = row_tokens[sample_begin:]
        last_was_timestamp = len(seq) >= 1 and seq[-1] >= tb
        penultimate_was_timestamp = len(seq) < 2 or seq[-2] >= tb
        if last_was_timestamp:
            if penultimate_was_timestamp:
                mask[k, tb:] = -np.inf
            else:
                mask[k, :eot] = -np.inf
        timestamps = [t for t in seq if t >= tb]
        if monotonic and timestamps:
            last = timestamps[-1] if last_was_timestamp and not penultimate_was_timestamp else timestamps[-1] + 1
            mask[k, tb:last] = -np.inf
    if len(rows[0]) == sample_begin:
        mask[:, :tb] = -np.inf
        if max_initial_timestamp_index is not None:
            mask[:, tb + max_initial_timestamp_index + 1 :] = -np.inf
    mask = mx.array(mask)
    if openai:
        logits, mask = logits + mask, mx.zeros_like(mask)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    timestamp_logprob = logprobs[:, tb:].logsumexp(axis=-1, keepdims=True)
    max_text_token_logprob = logprobs[:, :tb].max(axis=-1, keepdims=True)
    mask[:, :tb] = mx.where(timestamp_logprob > max_text_token_logprob, -mx.inf, mask[:, :tb])
    return logits + mask


def random_histories(tok: tokenizer.Tokenizer, rng: np.random.Generator, n_batch: int, length: int) -> np.ndarray:
    """`[n_batch, length]` sampled tokens: text, timestamps (increasing or not) and EOT mixed."""
    tb = tok.timestamp_begin
    kinds = rng.choice(3, size=(n_batch, length), p=[0.5, 0.4, 0.1])
    text = rng.integers(0, tok.eot, size=(n_batch, length))
    stamps = tb + rng.integers(0, 1501, size=(n_batch, length))
    return np.where(kinds == 0, text, np.where(kinds == 1, stamps, tok.eot))


def random_logits(tok: tokenizer.Tokenizer, rng: np.random.Generator, n_batch: int, regime: int) -> mx.array:
    """Regime 0: text likelier; 1: timestamps likelier; 2: near-ties between the two sides,
    with suppressed (-inf) tokens, as SuppressTokens leaves them."""
    n_vocab, tb = tok.encoding.n_vocab, tok.timestamp_begin
    logits = rng.standard_normal((n_batch, n_vocab)).astype(np.float32)
    if regime == 0:
        logits[:, rng.integers(0, tb, size=3)] += 12.0
    elif regime == 1:
        logits[:, tb:] += 4.0
    else:
        logits[:, :tb] = np.float32(np.log(n_vocab - tb))  # the timestamps' total against one text token
        logits[:, tb:] = 0.0
        logits[:, rng.integers(0, tb, size=5)] = -np.inf
    return mx.array(logits)


@pytest.mark.parametrize(("monotonic", "openai"), [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("max_initial", [None, 0, 50])
def test_timestamp_rules_on_the_device_equal_the_host_mask_bit_for_bit(small_tokenizer, monotonic, openai, max_initial):
    """The filter reads nothing back (its grammar is a function of `tokens` on the device) and
    gives the very bits mlx-whisper's host-built mask gives: every prefix length (0, 1, 2 and
    more sampled tokens), batch rows in every grammar state, three logit regimes."""
    tok = small_tokenizer
    rng = np.random.default_rng(18)
    sample_begin = 3
    rules = ApplyTimestampRules(
        tok, sample_begin, max_initial, fix_monotonic_timestamps=monotonic, openai_whisper=openai
    )
    compared = 0
    for n_sampled in (0, 1, 2, 3, 7):
        history = random_histories(tok, rng, 16, n_sampled)
        prompt = np.broadcast_to(np.array([tok.sot, 5, 6]), (16, sample_begin))
        for dtype in (mx.int32, mx.uint32):
            tokens = mx.array(np.concatenate([prompt, history], axis=1)).astype(dtype)
            for regime in range(3):
                logits = random_logits(tok, rng, 16, regime)
                expected = reference_timestamp_rules(tok, logits, tokens, sample_begin, max_initial, monotonic, openai)
                got = rules.apply(logits, tokens)
                assert got.dtype == mx.float32 and got.shape == logits.shape
                assert np.array_equal(np.array(got).view(np.uint32), np.array(expected).view(np.uint32)), (
                    n_sampled,
                    dtype,
                    regime,
                )
                compared += 1
    assert compared == 30


def test_a_wrong_device_timestamp_rule_is_seen_by_the_bitwise_comparison(small_tokenizer, monkeypatch):
    """The comparison above has teeth: an open pair that also forbids EOT differs from the reference."""
    tok = small_tokenizer
    tb = tok.timestamp_begin
    rules = ApplyTimestampRules(tok, 1, None)
    original = rules.grammar_mask

    def eot_too(tokens: mx.array, n_vocab: int) -> mx.array:  # an open pair forbids EOT as well
        return mx.where(
            (mx.arange(n_vocab)[None] == tok.eot) & (tokens[:, -1:] >= tb), -mx.inf, original(tokens, n_vocab)
        )

    monkeypatch.setattr(rules, "grammar_mask", eot_too)
    tokens = mx.array([[tok.sot, tb, 65, tb + 10]])  # a pair open: its closing timestamp or EOT next
    logits = row(tok, {65: 12.0})
    expected = reference_timestamp_rules(tok, logits, tokens, 1, None, False, False)
    assert not np.array_equal(np.array(rules.apply(logits, tokens)), np.array(expected))


class FakeDims:
    def __init__(self, n_vocab: int):
        self.n_mels, self.n_audio_ctx, self.n_audio_state = 80, 1500, 4
        self.n_vocab, self.n_text_ctx = n_vocab, 448


class ScriptedModel:
    """Stands in for Whisper: step i's logits put `script[i]` far ahead of the rest
    (`spread` sets how far), and the first call marks `<|nospeech|>` at the SOT position."""

    def __init__(self, tok: tokenizer.Tokenizer, script: list[int], spread: float = 10.0):
        self.tok, self.script, self.spread = tok, script, spread
        self.dims = FakeDims(tok.encoding.n_vocab)
        self.is_multilingual, self.num_languages, self.dtype = False, 0, mx.float32
        self.encoder_calls = 0

    def embed_audio(self, mel: mx.array) -> mx.array:
        self.encoder_calls += 1
        return mx.zeros((mel.shape[0], self.dims.n_audio_ctx, self.dims.n_audio_state))

    def logits(self, tokens: mx.array, audio_features: mx.array, kv_cache=None):
        step = 0 if kv_cache is None else kv_cache
        n_batch, n_tokens = tokens.shape
        out = np.zeros((n_batch, n_tokens, self.dims.n_vocab), np.float32)
        target = self.script[min(step, len(self.script) - 1)]
        out[:, -1, target] = self.spread
        if kv_cache is None:
            out[:, 0, self.tok.no_speech] = 3.0
        return mx.array(out), step + 1, [None]


class StepLog(DecodeObserver):
    def __init__(self):
        self.steps: list[tuple[list[int], bool]] = []
        self.begin = None

    def on_decode_begin(self, initial_tokens, n_batch, temperature):
        self.begin = (initial_tokens, n_batch, temperature)

    def on_step(self, logits, tokens, kept):
        self.steps.append((tokens.tolist(), kept))


def test_decoding_task_filter_order(small_tokenizer):
    model = ScriptedModel(small_tokenizer, [small_tokenizer.eot])
    task = DecodingTask(model, DecodingOptions(fp16=False), small_tokenizer.encoding)
    assert [type(f) for f in task.logit_filters] == [SuppressBlank, SuppressTokens, ApplyTimestampRules]
    suppressed = set(np.flatnonzero(np.isneginf(np.array(task.logit_filters[1].mask))).tolist())
    tok = small_tokenizer
    expected = {*tok.non_speech_tokens, tok.transcribe, tok.translate, tok.sot, tok.sot_prev, tok.sot_lm, tok.no_speech}
    assert suppressed == expected


def test_decode_loop_runs_one_step_past_the_end(small_tokenizer):
    tok = small_tokenizer
    tb = tok.timestamp_begin
    script = [tb, 65, 66, tb + 25, tok.eot]
    model = ScriptedModel(tok, script)
    log = StepLog()
    mel = mx.zeros((3000, 80))
    options = DecodingOptions(fp16=False, language="en", prefix=[70])  # SOT is not the last position
    result = decoding.decode(model, mel, tok.encoding, options, observer=log)

    assert result.tokens == [tb, 65, 66, tb + 25]
    assert result.text == "AB"
    assert log.begin == ((tok.sot, 70), 1, 0.0)
    # five kept steps (the last one appends EOT) and one computed past the end, dropped
    assert log.steps == [([t], True) for t in script] + [([tok.eot], False)]
    # no-speech probability: softmax at the SOT position of the first call
    n_vocab = tok.encoding.n_vocab
    assert result.no_speech_prob == pytest.approx(math.exp(3.0) / (math.exp(3.0) + n_vocab - 1), rel=1e-5)
    assert result.avg_logprob < 0 and result.compression_ratio == compression_ratio("AB")


def test_teacher_forcing_feeds_the_given_tokens(small_tokenizer):
    tok = small_tokenizer
    tb = tok.timestamp_begin
    model = ScriptedModel(tok, [tb, 65, 66, tb + 25, tok.eot])
    mel = mx.zeros((3000, 80))
    options = DecodingOptions(fp16=False, language="en")
    free = decoding.decode(model, mel, tok.encoding, options)
    replay = decoding.decode(model, mel, tok.encoding, options, forced_tokens=[free.tokens])
    assert replay.tokens == free.tokens and replay.avg_logprob == free.avg_logprob
    other = decoding.decode(model, mel, tok.encoding, options, forced_tokens=[[tb, 67, tb + 25]])
    assert other.tokens == [tb, 67, tb + 25] and other.avg_logprob < free.avg_logprob


def test_prompt_and_prefix_budgets(small_tokenizer):
    tok = small_tokenizer
    model = ScriptedModel(tok, [tok.eot])
    prompt = [40 + i % 50 for i in range(300)]
    task = DecodingTask(model, DecodingOptions(fp16=False, prompt=prompt, prefix=[70, 71]), tok.encoding)
    # <|startofprev|>, the last n_ctx // 2 - 1 = 223 prompt tokens, SOT, then the prefix
    assert task.initial_tokens == (tok.sot_prev, *prompt[77:], tok.sot, 70, 71)
    assert (task.sample_begin, task.sot_index) == (227, 224)
    no_ts = DecodingTask(model, DecodingOptions(fp16=False, without_timestamps=True), tok.encoding)
    assert no_ts.initial_tokens == (tok.sot, tok.no_timestamps)
    assert not any(isinstance(f, ApplyTimestampRules) for f in no_ts.logit_filters)


# --------------------------------------------------------------------------- decoder, ranker, ratios


def test_greedy_decoder_sums_until_eot_and_pads_with_eot():
    decoder = GreedyDecoder(0.0, eot=3)
    logits = mx.array([[0.0, 2.0, 1.0, 0.5], [0.0, 2.0, 1.0, 0.5]])
    tokens = mx.array([[0, 1], [0, 3]])  # the second sequence already ended
    sums = mx.zeros(2)
    tokens, completed, sums = decoder.update(tokens, logits, sums)
    expected = 2.0 - math.log(math.exp(0) + math.exp(2) + math.exp(1) + math.exp(0.5))
    assert tokens.tolist() == [[0, 1, 1], [0, 3, 3]]
    assert not completed.item()
    assert sums.tolist()[0] == pytest.approx(expected, rel=1e-6) and sums.tolist()[1] == 0.0


def test_greedy_decoder_adds_in_place_like_mlx_whisper():
    """The step computed past the end updates the caller's sums in place (by 0 x logprob)."""
    decoder = GreedyDecoder(0.0, eot=3)
    sums = mx.array([-1.5])
    decoder.update(mx.array([[0, 1]]), mx.array([[0.0, 2.0, 1.0, 0.5]]), sums)
    assert sums.item() != -1.5


def test_ranker_length_normalization_and_penalty():
    tokens = [[[1] * 10, [1] * 2]]
    sums = [[-5.0, -2.0]]
    assert MaximumLikelihoodRanker(None).rank(tokens, sums) == [0]  # -0.5 beats -1.0
    assert MaximumLikelihoodRanker(0.0).rank(tokens, sums) == [1]  # no length penalty: -2 beats -5


def test_compression_ratio_is_zlib_level_6():
    text = "the the the the the the the the the the the the the the"
    data = text.encode()
    assert compression_ratio(text) == len(data) / len(zlib.compress(data, 6))
    assert compression_ratio(text) > 2.4 > compression_ratio("The quick brown fox jumps over the lazy dog.")


def result_with(avg_logprob: float, ratio: float, no_speech: float, temperature: float = 0.0) -> DecodingResult:
    return DecodingResult(
        audio_features=mx.zeros((1,)),
        language="en",
        avg_logprob=avg_logprob,
        compression_ratio=ratio,
        no_speech_prob=no_speech,
        temperature=temperature,
    )


@pytest.mark.parametrize(
    ("avg_logprob", "ratio", "no_speech", "fallback", "skip", "reasons"),
    [
        (-0.2, 1.2, 0.1, False, False, []),
        (-0.2, 2.5, 0.1, True, False, ["compression_ratio"]),
        (-1.2, 1.2, 0.1, True, False, ["avg_logprob"]),
        (-1.2, 2.5, 0.7, False, True, ["compression_ratio", "avg_logprob", "overridden_by_no_speech"]),
        (-0.2, 1.2, 0.7, False, False, []),  # confident text despite the no-speech probability
        (-1.0, 2.4, 0.6, False, False, []),  # thresholds are strict comparisons
    ],
)
def test_fallback_and_silence_decisions(avg_logprob, ratio, no_speech, fallback, skip, reasons):
    result = result_with(avg_logprob, ratio, no_speech)
    assert needs_fallback(result, 2.4, -1.0, 0.6) is fallback
    assert should_skip(result, -1.0, 0.6) is skip
    thresholds = {"compression_ratio_threshold": 2.4, "logprob_threshold": -1.0, "no_speech_threshold": 0.6}
    assert fallback_reasons(result, thresholds) == reasons
    assert needs_fallback(result, None, None, None) is False and should_skip(result, -1.0, None) is False


# --------------------------------------------------------------------------- segments and seeking


def test_segments_at_timestamp_pairs_single_timestamp_ending(small_tokenizer):
    tok = small_tokenizer
    tb = tok.timestamp_begin
    tokens = [tb, 65, 66, tb + 50, tb + 50, 67, tb + 100]
    result = result_with(-0.3, 1.1, 0.01)
    window = split_segments(tokens, tok, result, seek=150, segment_size=2000, input_stride=2)
    assert window.seek_advance == 2000  # ends on a single timestamp: the window is done
    assert [(s["seek"], s["start"], s["end"], s["text"], s["tokens"]) for s in window.segments] == [
        (150, 1.5 + 0 * 0.02, 1.5 + 50 * 0.02, "AB", [tb, 65, 66, tb + 50]),
        (150, 1.5 + 50 * 0.02, 1.5 + 100 * 0.02, "C", [tb + 50, 67, tb + 100]),
    ]
    assert window.segments[0]["avg_logprob"] == -0.3


def test_segments_unfinished_tail_seeks_to_last_timestamp(small_tokenizer):
    tok = small_tokenizer
    tb = tok.timestamp_begin
    window = split_segments(
        [tb, 65, tb + 40, tb + 40, 66], tok, result_with(-0.3, 1.1, 0.01), seek=0, segment_size=3000, input_stride=2
    )
    assert [s["tokens"] for s in window.segments] == [[tb, 65, tb + 40]]
    assert window.seek_advance == 80  # timestamp 40 x 2 frames per position


def test_segment_without_pairs_ends_at_its_last_timestamp(small_tokenizer):
    tok = small_tokenizer
    tb = tok.timestamp_begin
    result = result_with(-0.3, 1.1, 0.01)
    one = split_segments([tb, 65, 66, tb + 40], tok, result, seek=100, segment_size=1234, input_stride=2)
    assert [(s["start"], s["end"]) for s in one.segments] == [(1.0, 1.0 + 40 * 0.02)]
    assert one.seek_advance == 1234
    bare = split_segments([65, 66], tok, result, seek=100, segment_size=1234, input_stride=2)
    assert [(s["start"], s["end"]) for s in bare.segments] == [(1.0, 1.0 + 1234 * 160 / 16000)]
    empty = split_segments([], tok, result, seek=0, segment_size=300, input_stride=2)
    assert [(s["tokens"], s["text"]) for s in empty.segments] == [([], "")]


def test_clip_timestamps():
    assert parse_clip_timestamps("0", 2000) == [(0, 2000)]
    assert parse_clip_timestamps("", 2000) == [(0, 2000)]
    assert parse_clip_timestamps("1.5,3,10", 2000) == [(150, 300), (1000, 2000)]
    assert parse_clip_timestamps([1.0, 30.0], 2000) == [(100, 2000)]


# --------------------------------------------------------------------------- the seek loop


def test_transcribe_falls_back_on_repetition_and_records_calls(small_tokenizer):
    tok = small_tokenizer
    tb = tok.timestamp_begin
    repetitive = [tb, *[65, 66] * 30, tb + 100, tok.eot]  # "ABAB..." compresses far above 2.4
    model = ScriptedModel(tok, repetitive, spread=40.0)  # so sharp that sampling picks the same
    audio = np.zeros(16000 * 2, np.float32)
    recorder = TranscriptionRecorder(
        {"compression_ratio_threshold": 2.4, "logprob_threshold": -1.0, "no_speech_threshold": 0.6}, 3, tok.eot
    )
    out = transcribe(model, audio, tok.encoding, temperature=(0.0, 0.5, 1.0), fp16=False, observer=recorder)
    calls = recorder.decode_calls
    assert [(c["seek"], c["temperature"], c["needs_fallback"], c["attempt"], c["kept"]) for c in calls] == [
        (0, 0.0, True, 0, False),
        (0, 0.5, True, 1, False),
        (0, 1.0, True, 2, True),
    ]
    assert model.encoder_calls == 3  # each attempt encodes the window again
    assert calls[0]["fallback_reasons"] == ["compression_ratio"] and calls[0]["lookahead_steps"] == 1
    assert [len(c["member_tokens"][0]) for c in calls] == [len(repetitive) - 1] * 3
    assert len(recorder.tokens) == sum(c["n_steps"] for c in calls) == 3 * len(repetitive)
    # the clip is 2 s: one window of 200 content frames, kept as one segment ending at 2.00
    assert [(s["seek"], s["start"], s["end"]) for s in out["segments"]] == [(0, 0.0, 2.0)]
    assert out["segments"][0]["temperature"] == 1.0 and out["text"] == "AB" * 30

    replay = TranscriptionRecorder(recorder.thresholds, 3, tok.eot)
    forced = [ForcedCall(c["seek"], c["temperature"], c["member_tokens"], c["needs_fallback"]) for c in calls]
    again = transcribe(
        model, audio, tok.encoding, temperature=(0.0, 0.5, 1.0), fp16=False, observer=replay, forced_calls=forced
    )
    assert again == out and replay.decode_calls == calls


def test_transcribe_clears_an_empty_segment_and_skips_a_silent_window(small_tokenizer):
    tok = small_tokenizer
    tb = tok.timestamp_begin
    model = ScriptedModel(tok, [tb, tok.eot])
    audio = np.zeros(16000, np.float32)
    options = {"temperature": 0.0, "fp16": False, "no_speech_threshold": 1e-4, "prefix": [70]}
    out = transcribe(model, audio, tok.encoding, **options)
    # no text at all: avg_logprob is high (not skipped) -> one empty segment, cleared
    assert out["segments"][0]["text"] == "" and out["segments"][0]["words"] == []
    low = transcribe(model, audio, tok.encoding, logprob_threshold=0.0, **options)
    assert low["segments"] == [] and low["text"] == ""
