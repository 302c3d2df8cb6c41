"""Language detection is gated: an in-tree Whisper that detects another language fails the gates,
naming the transcript's `language`.

No check of its own: detection runs before the first decode call (mlx-whisper's transcribe),
and its outcome is what the speech gates compare: the transcript's `language`, every decode
call's initial tokens (<|lang|>) and the logits fed them. Judged against the committed golden
of the whisper-large-v3-turbo mini twin's `fox-detect-language` (multilingual, cheap); the
real-weights scenarios are whisper-base's `fox-detect-language` (English) and
`french-detect-language` (French).
"""

from __future__ import annotations

import pytest

from harness.session import ParitySession

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("whisper-large-v3-turbo-mini")]

MODEL = "whisper-large-v3-turbo-mini"
SCENARIO = "fox-detect-language"


def test_a_runner_up_language_fails_the_transcript_and_decode_gates(monkeypatch: pytest.MonkeyPatch) -> None:
    import models.whisper.seek_loop as seek_loop

    original = seek_loop.detect_language
    chosen: list[tuple[str, str]] = []

    def runner_up(model, mel, tokenizer):
        tokens, probs = original(model, mel, tokenizer)
        ranked = sorted(probs, key=probs.get, reverse=True)
        chosen.append((ranked[0], ranked[1]))
        # The top language's probability zeroed: transcribe's argmax picks the runner-up.
        return tokens, {lang: (0.0 if lang == ranked[0] else p) for lang, p in probs.items()}

    monkeypatch.setattr(seek_loop, "detect_language", runner_up)
    session = ParitySession()
    profile = session.profile(MODEL)
    scenario = profile.scenario(SCENARIO)
    golden = session.golden(profile, scenario).record
    results = {c: session.run_check(profile, scenario, c) for c in ("transcript", "fallback_decisions")}
    assert chosen, "the in-tree transcribe never detected a language"
    top, second = chosen[0]
    assert golden.extra["transcript"]["language"] == top  # unperturbed, the in-tree detection is the oracle's
    transcript = results["transcript"]
    assert not transcript.passed, transcript.summary
    assert transcript.details["path"] == ".language", transcript.summary
    assert f"oracle {top!r} vs in-tree {second!r}" in transcript.summary, transcript.summary
    assert not results["fallback_decisions"].passed, results["fallback_decisions"].summary
    intree_calls = session.intree(profile, scenario, "free").extra["decode_calls"]
    golden_calls = golden.extra["decode_calls"]
    assert intree_calls[0]["initial_tokens"][1] != golden_calls[0]["initial_tokens"][1]  # <|lang|>
