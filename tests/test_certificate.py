"""The conversion certificate (issue 33 part 6): its metrics, its record, its judgement, and the
real thing on whisper-tiny-en: CTranslate2 on the original model.bin against mlx-whisper on the
converted weights, passing on the real converter and failing on a wrong one while L1 passes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from harness.certificate.metrics import step_metrics, worst
from harness.certificate.record import CertificateError, CertificateRecord, bound_of, read_record, write_record
from harness.certificate.run import divergence, judge
from harness.errors import ProfileError

CALIBRATION = {
    "GENERIC": {"fox": {"encoder_max_abs": 1e-4, "steps": [[1e-7, True, 1e-3], [2e-7, True, 2e-3]]}},
    "AVX2": {"fox": {"encoder_max_abs": 2e-4, "steps": [[3e-7, True, 1e-3], [1e-7, True, 4e-3]]}},
}


def test_step_metrics_compare_whole_rows() -> None:
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((3, 50)).astype(np.float32)
    same = step_metrics(rows, rows.copy())
    assert all(s.kl == 0.0 and s.top1 and s.max_abs == 0.0 for s in same)
    other = rows.copy()
    other[1, int(rows[1].argmax())] -= 10.0  # the top token pushed down in one row
    moved = step_metrics(rows, other)
    assert moved[0].kl == 0.0 and moved[1].kl > 0.1 and not moved[1].top1 and moved[1].max_abs == pytest.approx(10.0)
    masked = rows.copy()
    masked[2, 7] = np.finfo(np.float32).min  # the runtime's processors masked one entry: left out
    assert step_metrics(rows, masked)[2].masked == 1 and step_metrics(rows, masked)[2].kl == 0.0
    broken = rows.copy()
    broken[2, 7] = np.nan  # anything else is never a pass
    assert step_metrics(rows, broken)[2].kl == np.inf
    assert worst(moved)["top1_agreement"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match=r"logits of shape \(3, 49\), expected the reference's \(3, 50\)"):
        step_metrics(rows, rows[:, :49])


def test_the_bound_is_headroom_over_the_runtime_s_own_spread() -> None:
    bound = bound_of(CALIBRATION)
    assert bound["max_kl"] == pytest.approx(2 * 3e-7) and bound["max_abs"] == pytest.approx(2 * 4e-3)
    assert bound["encoder_max_abs"] == pytest.approx(2 * 2e-4) and bound["min_top1_agreement"] == 1.0


ROWS = np.zeros((2, 10))
ROWS[1, 6], ROWS[1, 8] = 2.0, 1.995  # step 1: the oracle's token 6 beats 8 by 0.005, every other by 2


def _figures(kl: float = 1e-7, max_abs: float = 1e-3, free: list[int] | None = None) -> dict:
    return {
        "fox": {
            "encoder_max_abs": 1e-4,
            "steps": [[1e-7, True, 1e-3], [kl, True, max_abs]],
            "free_tokens": free if free is not None else [5, 6],
            "oracle_tokens": [5, 6],
            "divergence": divergence(free if free is not None else [5, 6], [5, 6], ROWS),
        }
    }


def test_judge_names_the_first_step_and_figure_over_the_bound() -> None:
    bound = bound_of(CALIBRATION)
    assert judge(_figures(), bound) == []
    assert judge(_figures(kl=1e-3), bound) == [
        "fox: step 1: KL 0.001 (bound 6e-07), max |logit diff| 0.001 (bound 0.008)"
    ]
    assert judge(_figures(max_abs=0.5), bound)[0].startswith("fox: step 1: KL 1e-07")
    assert judge(_figures(free=[5, 7]), bound) == [
        "fox: the runtime's own tokens differ from the oracle's at step 1, not a near-tie (the oracle's margin 2 > "
        "bound 0.008)"
    ]
    assert judge(_figures(free=[5, 8]), bound) == []  # a near-tie: the oracle's margin 0.005 is within the bound
    assert judge(_figures(free=[5]), bound)[0].startswith(
        "fox: the runtime's own tokens differ from the oracle's at step 1"
    )


def _record() -> CertificateRecord:
    certifies = {"original": {"sha256": "ab"}, "runtime_pins": "p1", "scenarios": ["fox"]}
    return CertificateRecord("tiny", "ctranslate2", "key", certifies, CALIBRATION, bound_of(CALIBRATION), {}, {})


def test_a_record_missing_edited_or_stale_is_an_error_naming_how_to_mend(tmp_path: Path) -> None:
    path = tmp_path / "ctranslate2.json"
    record = _record()
    with pytest.raises(
        CertificateError, match=r"no certificate calibration for tiny on key; run .*--calibrate --write"
    ):
        read_record(path, "tiny", "ctranslate2", "key", record.certifies)
    write_record(path, record)
    assert read_record(path, "tiny", "ctranslate2", "key", record.certifies) == record
    other = copy.deepcopy(record.certifies) | {"runtime_pins": "p2"}
    with pytest.raises(CertificateError, match=r"stale: runtime_pins changed since it was calibrated"):
        read_record(path, "tiny", "ctranslate2", "key", other)
    with pytest.raises(CertificateError, match=r"a record of tiny/ctranslate2 on key, expected tiny/ctranslate2 on k2"):
        read_record(path, "tiny", "ctranslate2", "k2", record.certifies)
    data = json.loads(path.read_text())
    data["bound"]["max_kl"] = 1.0  # widened by hand
    path.write_text(json.dumps(data))
    with pytest.raises(CertificateError, match=r"its sha256 does not match its content"):
        read_record(path, "tiny", "ctranslate2", "key", record.certifies)


def test_a_certificate_scenario_must_be_a_greedy_transcription(tmp_path: Path) -> None:
    from harness.paths import REPO_ROOT
    from harness.profile.load import load_profile

    text = (REPO_ROOT / "profiles" / "whisper-tiny-en.yaml").read_text()
    assert "scenarios: [fox-greedy]\n" in text
    path = tmp_path / "whisper-tiny-en.yaml"
    for scenario, expected in (
        ("weather-ladder", r"certificate.scenarios\[0\]: weather-ladder must be a plain greedy transcription"),
        ("fox-beam5", r"fox-beam5 must be a plain greedy transcription"),
        ("nope", r"certificate.scenarios\[0\]: no scenario 'nope'"),
    ):
        path.write_text(text.replace("scenarios: [fox-greedy]\n", f"scenarios: [{scenario}]\n"))
        with pytest.raises(ProfileError, match=expected):
            load_profile(path)


# ---------------------------------------------------------------- the real thing (CTranslate2 4.8.5)

MODEL = "whisper-tiny-en"
WRONG = "encoder.blocks.0.attn.query.weight"  # square (n_state, n_state): a transpose keeps its shape


def _session():
    from harness.session import ParitySession

    session = ParitySession(selected_scenarios={MODEL: {"fox-greedy"}})
    return session, session.profile(MODEL)


def test_the_real_conversion_is_certified_against_ctranslate2() -> None:
    from harness.certificate.run import certify

    session, profile = _session()
    doc = certify(session, profile)
    assert doc["verdict"] == "PASS", doc["problems"]
    fox = doc["figures"]["fox-greedy"]
    assert fox["top1_agreement"] == 1.0 and fox["max_kl"] <= doc["bound"]["max_kl"]


@pytest.mark.nightly  # make test's 30-minute budget (docs/benchmarks.md): make test-nightly
def test_a_wrong_conversion_fails_the_certificate_while_every_l1_gate_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A converter that transposes one square attention matrix: the oracle and the in-tree port
    load the same wrong weights and agree bit for bit; CTranslate2 on the original file does not."""
    import shutil

    from harness.artifacts.convert import ct2_whisper
    from harness.artifacts.resolve import resolve_artifact
    from harness.certificate.run import certify, record_path
    from harness.paths import goldens_dir
    from harness.provenance import golden_key

    session, profile = _session()
    record = record_path(profile, golden_key(profile.oracle).name)
    goldens = tmp_path / "goldens"
    monkeypatch.setenv("MLX_PARITY_GOLDENS", str(goldens))
    monkeypatch.setenv("MLX_PARITY_REPORTS", str(tmp_path / "reports"))
    copied = goldens_dir() / record.relative_to(record.parents[3])
    copied.parent.mkdir(parents=True)
    shutil.copyfile(record, copied)  # the real bound: calibrated on the right conversion

    mapped = ct2_whisper._mapped_tensors

    def wrong(consumer, dims):
        for name, array in mapped(consumer, dims):
            yield name, (array.T if name == WRONG else array)

    monkeypatch.setattr(ct2_whisper, "_mapped_tensors", wrong)
    monkeypatch.setattr(ct2_whisper, "CONVERTER_VERSION", "1-wrong-test")  # its own cache folder
    artifact = resolve_artifact(profile)
    try:
        session, profile = _session()
        scenario = profile.scenario("fox-greedy")
        # Every gate against the oracle (streamed_transcript compares the in-tree stream with the
        # in-tree batch run, not with the oracle: left out for time).
        checks = [c for c in profile.checks(scenario) if c != "streamed_transcript"]
        assert {"encoder_output", "decode_logits", "teacher_forced_logits", "greedy_tokens"} <= set(checks)
        results = {c: session.run_check(profile, scenario, c) for c in checks}
        assert all(r.passed for r in results.values()), {c: r.summary for c, r in results.items() if not r.passed}
        doc = certify(session, profile)
    finally:
        shutil.rmtree(artifact.model_dir, ignore_errors=True)
    assert doc["verdict"] == "FAIL", doc
    # Named where it shows: the tokens, the encoder, the first step over the bound, the agreement.
    assert doc["problems"][0].startswith("fox-greedy: the runtime's own tokens differ from the oracle's at step 1, not")
    assert any(p.startswith("fox-greedy: step 0: KL ") for p in doc["problems"]), doc["problems"]
