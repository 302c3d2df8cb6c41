"""Every check, once: its name, the in-tree run it judges, what it compares, where it applies,
and how it is judged. Profiles, the session, the tools and the tests read this table; no other
module lists check names (tests/test_layout.py looks for stray lists).

`judge` is the one way a check on a record pair is decided, as `make parity` decides it: a
compact golden by its sha256 digests when they settle it, the full vectors otherwise (they
explain a difference).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from harness.checks import scope
from harness.checks.compare import ULP_BUCKETS, CheckResult, compare_array, compare_json, compare_steps
from harness.checks.context import (
    CALIBRATION,
    FREE,
    FULL_GOLDEN,
    ORACLE_JOB,
    RUNS,
    STREAM,
    TEACHER_FORCED,
    CheckContext,
)
from harness.checks.exercise import DECODE_LOGITS, EOS_STOP, SPECULATIVE, STREAMED, Exercise
from harness.checks.exercise_budget import TOKEN_BUDGET
from harness.checks.exercise_text import DETOKENIZE, RESPONSE
from harness.checks.exercise_whisper import TRANSCRIPT, WRITERS
from harness.checks.response import check_response
from harness.checks.speculative import judge_speculative
from harness.checks.text import compare_stream_text
from harness.checks.tokens import (
    compare_eos,
    compare_prompt,
    compare_tokens,
    decode_tokens,
    fallback_decisions,
    without_logprob_fields,
)
from harness.errors import HarnessError
from harness.implementations import LLM, SPEECH, VAD
from harness.records import ScenarioRecord, array_sha256

Judge = Callable[[ScenarioRecord, ScenarioRecord], CheckResult]  # golden, in-tree -> verdict
ContextJudge = Callable[[CheckContext], CheckResult]  # a check over several runs


@dataclass(frozen=True)
class Check:
    name: str
    what: str  # one line: what it compares
    run: str  # the in-tree run judged: "free", "teacher_forced", "compiled"; "session": several runs,
    # judged by ParitySession itself; "vad": judged by the VAD gate per fixture
    records: tuple[str, ...]  # the record kinds it judges (harness/implementations.py: LLM, SPEECH, VAD)
    judges: str  # "bits": raw bits, never allclose; "tokens": what is decided from the floats
    # (tokens, text, timestamps, bytes), so a foreign-framework oracle can be judged; "tolerance"
    default: bool = False  # in a Llama profile's checks when it names none
    compare: Judge | None = None  # golden, in-tree `run` -> verdict (None: run == "session" or "vad")
    rows: Callable[[ScenarioRecord], Sequence[int]] | None = None  # logits rows it judges
    array: str | None = None  # the record array it compares
    digest_tokens: bool = False  # equal tokens settle it on a compact golden (the logits only explain)
    localized: bool = False  # a failure is localized to the first diverging module
    # Against a compact golden the judge runs on its digests and JSON; a pass settles it, a
    # failure is judged again on the full vectors, which say where (step, row) it differs.
    rejudge_failures: bool = False
    failing_tests: tuple[str, ...] = ()  # tests (beside make mutants) that make it fail on a perturbation
    # The paths it must see walked by some scenario of a profile, or it proved nothing there
    # (harness/checks/exercise.py; judged over the profile by harness/coverage.py).
    exercises: Exercise | None = None
    # A "session" check's judge over several runs, and what it needs besides (harness/checks/context.py).
    judge_runs: ContextJudge | None = None
    needs: tuple[str, ...] = ()
    applies: scope.Scope | None = None  # named on a scenario it cannot judge: why (a profile error)
    # Run kinds it needs of the implementation beyond the runs in `needed` (harness/capabilities.py).
    also_runs: tuple[str, ...] = ()
    wanted: scope.Scope | None = None  # not named on a scenario that asks for it: why (a profile error)

    @property
    def needed(self) -> tuple[str, ...]:
        """Everything the session makes before judging: the in-tree run compared, then `needs`."""
        return ((self.run,) if self.run in RUNS else ()) + self.needs

    def judge(self, context: CheckContext) -> CheckResult:
        """The one way the check is decided on a scenario, whatever it needs."""
        if self.compare is not None:
            golden, actual = context.golden(), context.intree(self.run)
            result = judge_pair(self.name, golden, actual, context.full_golden)
            if not result.passed and self.rows is not None and list(golden.prompt_ids) != list(actual.prompt_ids):
                # external-2 F14: rows after different prompts are not like for like; say so.
                result.summary += (
                    "; compared on different inputs: the prompts differ (prompt_identity says where), "
                    "so every row differs from there"
                )
                result.details["inputs_differ"] = "prompt_ids"
            return result
        if self.judge_runs is None:
            raise HarnessError(f"check {self.name!r} is judged per fixture by the VAD gate, not on a scenario")
        return self.judge_runs(context)


def _steps(name: str, rows: Callable[[ScenarioRecord], Sequence[int]]) -> Judge:
    return lambda g, a: compare_steps(name, g, a, rows(g))


def _compiled_decode(golden: ScenarioRecord, actual: ScenarioRecord) -> CheckResult:
    """The compiled decode loop, free-running: every row bit for bit, then the tokens."""
    result = compare_steps("compiled_decode", golden, actual, range(len(golden.tokens)))
    if not result.passed:
        return result
    tokens = compare_tokens("compiled_decode", golden, actual)
    if not tokens.passed:
        return tokens
    result.summary += " (compiled single-token decode step)"
    return result


def _json(name: str, what: str, pick: Callable[[ScenarioRecord], Any]) -> Judge:
    return lambda g, a: compare_json(name, what, pick(g), pick(a))


def _prefill(g: ScenarioRecord) -> Sequence[int]:
    return g.prefill_rows()


def _decode(g: ScenarioRecord) -> Sequence[int]:
    return g.decode_rows()


def _every_step(g: ScenarioRecord) -> Sequence[int]:
    return range(len(g.tokens))


# -- a draft scenario names the speculative gate (the free-run Llama checks beside it) --------


def _speculative_wanted(profile: Any, s: Any) -> str | None:
    if s.draft is None:
        return None
    return (
        f".checks: a draft scenario names 'speculative' and only {of_run(LLM, 'free')}; speculative missing "
        "(teacher forcing and the compiled decode do not apply)"
    )


# -- judges over several runs (imported when judged: token_budget brings mlx) ------------------


def _judge_streamed(context: CheckContext) -> CheckResult:
    from harness.checks.streamed import judge_streamed

    return judge_streamed(context)


def _judge_writers(context: CheckContext) -> CheckResult:
    from harness.checks.writers import judge_writers

    return judge_writers(context)


def _judge_token_budget(context: CheckContext) -> CheckResult:
    from harness.checks.token_budget import judge_token_budget

    return judge_token_budget(context)


_TOKEN_LEVEL_TESTS = (
    "tests/test_token_level_checks.py::test_token_level_checks_ignore_foreign_floats_and_catch_token_and_text_changes",
)
_BEAM = "tests/test_whisper_beam_gates.py::"  # a perturbed in-tree beam search, judged through the session
_BEAM_RANKING = _BEAM + "test_a_beam_ranking_that_picks_the_worst_finished_sequence_fails_both_token_gates"
_BEAM_REORDER = _BEAM + "test_beam_rows_whose_cache_is_not_reordered_fail_decode_tokens_at_the_first_wrong_row"

_VAD = "tests/test_vad.py::"

_TABLE = (
    Check("prompt_identity", "the prompt's token ids", "free", (LLM,), "bits", True,
          lambda g, a: compare_prompt("prompt_identity", g, a)),
    Check("prefill_logits", "the prompt's last-position logits", "free", (LLM, SPEECH), "bits", True,
          _steps("prefill_logits", _prefill), rows=_prefill, localized=True),
    Check("decode_logits", "every decode step's logits, free-running", "free", (LLM, SPEECH), "bits", True,
          _steps("decode_logits", _decode), rows=_decode, localized=True, exercises=DECODE_LOGITS),
    Check("teacher_forced_logits", "every step's logits, fed the golden's tokens", "teacher_forced",
          (LLM, SPEECH), "bits", True, _steps("teacher_forced_logits", _every_step), rows=_every_step,
          localized=True),
    Check("greedy_tokens", "the chosen tokens", "free", (LLM, SPEECH), "bits", True,
          lambda g, a: compare_tokens("greedy_tokens", g, a), digest_tokens=True),
    Check("eos_stop", "where generation stops", "free", (LLM,), "bits", True,
          lambda g, a: compare_eos("eos_stop", g, a), digest_tokens=True,
          failing_tests=("tests/test_gate_fails.py::test_a_run_that_does_not_stop_at_eos_fails_eos_stop",),
          exercises=EOS_STOP),
    Check("detokenize", "streamed text pieces, one per token, and the full decode (fed the golden's ids)",
          "teacher_forced", (LLM,), "tokens", True, compare_stream_text,
          failing_tests=("tests/test_detokenize.py::test_detokenize_fails_on_an_in_tree_stream_that_drops_a_byte",),
          exercises=DETOKENIZE),
    Check("draft_stats", "drafted / accepted counts of every step (L2 drafting)", "free", (LLM,), "bits",
          compare=_json("draft_stats", "drafted/accepted counts", lambda r: r.extra.get("step_info")),
          applies=scope.draft_stats_applies),
    Check("speculative", "draft-model speculative decoding: every verify row, accepted counts, tokens, draft cache",
          "free", (LLM,), "bits", compare=judge_speculative, rejudge_failures=True,
          failing_tests=("tests/test_speculative.py::test_an_acceptance_rule_off_by_one_fails_the_speculative_gate",),
          exercises=SPECULATIVE,
          applies=scope.speculative_applies, wanted=_speculative_wanted),
    Check("compiled_decode", "the compiled single-token decode loop, every row and token", "compiled", (LLM,),
          "bits", compare=_compiled_decode, rows=_every_step,
          failing_tests=("tests/test_compiled_decode.py::"
                         "test_compiled_decode_check_fails_through_the_session_on_a_perturbed_trace",),
          applies=scope.compiled_applies, wanted=scope.compiled_wanted),
    Check("response", "mlx-lm server's reasoning / content / tool_calls split, streamed chunks and whole",
          "teacher_forced", (LLM,), "bits", compare=check_response,
          failing_tests=("tests/test_response.py::test_response_fails_on_a_parser_that_reads_a_number_as_a_string",
                         "tests/test_response.py::test_response_fails_when_a_forced_text_encodes_differently"),
          exercises=RESPONSE,
          applies=scope.response(True), wanted=scope.response(False)),
    Check("mel", "the log-mel spectrogram", "free", (SPEECH,), "bits",
          compare=lambda g, a: compare_array("mel", g, a, "mel"), array="mel"),
    Check("encoder_output", "the audio encoder's output", "free", (SPEECH,), "bits",
          compare=lambda g, a: compare_array("encoder_output", g, a, "encoder"), array="encoder"),
    Check("transcript", "the transcript, log-probs included", "free", (SPEECH,), "bits",
          compare=_json("transcript", "transcript", lambda r: r.extra.get("transcript")), exercises=TRANSCRIPT),
    Check("fallback_decisions", "decode calls and temperature-fallback decisions", "free", (SPEECH,), "bits",
          compare=_json("fallback_decisions", "decode calls and fallback decisions", fallback_decisions)),
    Check("decode_tokens", "every row's token and each decode call's chosen tokens", "free", (SPEECH,), "tokens",
          compare=decode_tokens, digest_tokens=True,
          failing_tests=(*_TOKEN_LEVEL_TESTS, _BEAM_RANKING, _BEAM_REORDER)),
    Check("transcript_text", "the transcript's text, tokens and timestamps (log-probs left out)", "free",
          (SPEECH,), "tokens",
          compare=_json("transcript_text", "transcript (text, tokens, timestamps; log-prob floats left out)",
                      lambda r: without_logprob_fields(r.extra.get("transcript"))),
          failing_tests=(*_TOKEN_LEVEL_TESTS, _BEAM_RANKING)),
    Check("writers", "txt, vtt, srt, tsv and json writers' bytes", "session", (SPEECH,), "tokens",
          failing_tests=("tests/test_whisper_writers.py::test_a_line_width_off_by_one_fails_naming_a_subtitle_format",
                         "tests/test_exercise_words.py::"
                         "test_truncated_milliseconds_fail_the_writers_gate_only_where_the_path_is_walked"),
          exercises=WRITERS,
          judge_runs=_judge_writers, needs=(ORACLE_JOB,), wanted=scope.writers_wanted,
          also_runs=("free", "writers")),
    Check("streamed_transcript", "the streaming transcriber (1, 7, 30 s chunks) against the batch run, in-tree",
          "session", (SPEECH,), "bits",
          failing_tests=("tests/test_whisper_stream.py::test_a_stream_that_drops_the_last_window_fails_the_gate",),
          exercises=STREAMED,
          judge_runs=_judge_streamed, needs=(FREE, STREAM),
          applies=scope.streamed_applies, wanted=scope.streamed_wanted),
    Check("token_budget", "L2 fast path: differing tokens within a calibrated budget, each a near-tie",
          "session", (SPEECH,), "tokens",
          failing_tests=("tests/test_whisper_fast.py::test_the_gate_fails_a_fast_path_whose_logits_are_scaled_by_1_01",
                         "tests/test_whisper_fast.py::test_the_gate_fails_an_attention_scale_one_ulp_off",
                         "tests/test_whisper_fast.py::test_the_gate_fails_a_budget_edited_away_from_its_record"),
          exercises=TOKEN_BUDGET,
          judge_runs=_judge_token_budget,
          needs=(FREE, TEACHER_FORCED, FULL_GOLDEN, CALIBRATION),
          applies=scope.token_budget(named=True), wanted=scope.token_budget(named=False)),
    Check("input", "the fixture's samples as the oracle read them", "vad", (VAD,), "bits",
          failing_tests=(_VAD + "test_input_fails_when_the_oracle_read_other_samples_and_nothing_else_is_compared",)),
    Check("probabilities", "per-chunk speech probabilities, within the measured tolerance", "vad", (VAD,),
          "tolerance", failing_tests=(_VAD + "test_gate_fails_on_perturbed_graph",
                                      _VAD + "test_probability_tolerance_is_enforced")),
    Check("segments", "speech segments per timestamp option set", "vad", (VAD,), "bits",
          failing_tests=(_VAD + "test_gate_fails_on_changed_threshold",)),
    Check("streaming", "streaming probabilities against the batch run", "vad", (VAD,), "bits",
          failing_tests=(_VAD + "test_streaming_gate_is_bit_exact",)),
)  # fmt: skip

CHECKS: dict[str, Check] = {c.name: c for c in _TABLE}


def get(name: str) -> Check:
    if name not in CHECKS:
        raise HarnessError(f"unknown check {name!r}; known: {sorted(CHECKS)}")
    return CHECKS[name]


def of(records: str) -> list[str]:
    """The checks a profile whose implementation produces `records` may name, in table order."""
    return [c.name for c in _TABLE if records in c.records]


def of_run(records: str, run: str) -> list[str]:
    """The checks of these records that judge this in-tree run ("free", ...)."""
    return [c.name for c in _TABLE if records in c.records and c.run == run]


def defaults() -> list[str]:
    """A Llama profile's checks when it names none."""
    return [c.name for c in _TABLE if c.default]


def judged_on(judges: str) -> list[str]:
    """The checks judged on "bits", "tokens" or "tolerance"."""
    return [c.name for c in _TABLE if c.judges == judges]


def with_exercises() -> list[str]:
    """The checks that declare paths a profile's scenarios must walk."""
    return [c.name for c in _TABLE if c.exercises is not None]


def asked_for(profile: Any, scenario: Any) -> list[str]:
    """The checks a scenario asks for by its keys: each row whose `wanted` hook says the scenario
    must name it (a `response:` key asks for the response check)."""
    return [c.name for c in _TABLE if c.wanted is not None and c.wanted(profile, scenario) is not None]


def judge_pair(
    name: str, golden: ScenarioRecord, actual: ScenarioRecord, full: Callable[[], ScenarioRecord]
) -> CheckResult:
    """A record check as `make parity` decides it: a compact golden by its digests when they
    settle it, else against the full vectors (`full()` fetches them), which explain a difference."""
    check = get(name)
    if check.compare is None:
        raise HarnessError(f"check {name!r} judges {check.run} runs, not one record pair")
    if golden.is_compact:
        decided = decide_by_digest(check, golden, actual)
        if decided is not None:
            return decided
        golden = full()
    return check.compare(golden, actual)


def decide_by_digest(check: Check, golden: ScenarioRecord, actual: ScenarioRecord) -> CheckResult | None:
    """Judge against a compact golden by hashes alone when that settles it; None when the
    check needs the full vectors (a difference to explain)."""
    assert check.compare is not None
    if check.rejudge_failures:
        result = check.compare(golden, actual)
        return result if result.passed else None
    if check.rows is not None:
        rows = list(check.rows(golden))
        if not rows or actual.logits.ndim != 2 or actual.logits.shape[1:] != (golden.compact.vocab,):
            return None  # the full comparison says what is wrong (nothing to compare is an error there)
        if actual.logits.shape[0] != len(golden.compact.row_sha256):
            return None
        if golden.compact.mismatches(actual.logits, rows, actual.row_hashes()) or actual.tokens != golden.tokens:
            return None
        histogram = {b: (len(rows) * golden.compact.vocab if b == "0" else 0) for b in ULP_BUCKETS}
        return CheckResult(
            check.name,
            True,
            f"{len(rows)} steps bit-identical (sha256 of each vector's raw bits equals the compact golden's)",
            steps_compared=len(rows),
            per_step=[{"step": r, "max_abs_diff": 0.0, "max_ulp": 0, "n_differing": 0} for r in rows],
            details={"decided_by": "sha256", "ulp_histogram": histogram},
        )
    if check.array is not None:
        name = check.array
        if name in golden.arrays:
            return None  # the blob is at hand: the full comparison costs nothing more
        digest = golden.array_digests.get(name)
        if digest is None or name not in actual.arrays or array_sha256(actual.arrays[name]) != digest:
            return None
        shape = "x".join(str(n) for n in actual.arrays[name].shape)
        return CheckResult(check.name, True, f"{name} ({shape}) bit-identical (sha256 of raw bits)")
    if check.digest_tokens and actual.tokens != golden.tokens:
        return None
    return check.compare(golden, actual)  # judged on tokens / JSON only
