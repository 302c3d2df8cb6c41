"""The conversion certificate (issue 33 part 6): the converted weights, as the mlx oracle computes
them (its goldens), against the original file run by its own runtime (CTranslate2 on model.bin).

The oracle and the in-tree side load the same converted weights, so no L1 gate sees a converter
bug; this does. Per certificate scenario (a profile's `certificate.scenarios`, greedy Whisper
scenarios) it takes the golden's first window (log-mel, encoder output, every logits row of its
first decode call and the tokens chosen), hands the log-mel and tokens to the runtime
(oracles/<runtime>/certify.py, in its own venv) and compares: the runtime's encoder output, its
logits teacher-forced on the oracle's tokens (harness/certificate/metrics.py) and its own free
greedy tokens. The bound is the profile's calibration record on this golden key
(harness/certificate/record.py); a key without one is an ERROR, never a pass.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import platform
from pathlib import Path
from typing import Any

import numpy as np

from harness.artifacts.resolve import original_files
from harness.certificate.metrics import StepMetrics, step_metrics, worst
from harness.certificate.record import CertificateError, CertificateRecord, bound_of, read_record, write_record
from harness.oracle.pins import pins_hash, read_pins
from harness.oracle.process import OracleProcess, work_directory
from harness.paths import goldens_dir
from harness.profile import Profile

ISAS = ("GENERIC", "AVX", "AVX2", "AVX512")
N_FRAMES = 3000  # one 30 s window of log-mel frames  # CTranslate2's CPU kernels (CT2_FORCE_CPU_ISA)


@dataclasses.dataclass(frozen=True)
class Window:
    """What the runtime is handed of one scenario's golden, and what it is compared with."""

    scenario: str
    mel: np.ndarray  # (n_mels, 3000)
    encoder: np.ndarray  # (n_audio_ctx, n_audio_state)
    initial: list[int]
    tokens: list[int]  # the tokens chosen after each row (the last one ends the call)
    rows: np.ndarray  # (len(tokens), n_vocab)
    golden_identity: str


def first_window(mel: np.ndarray) -> np.ndarray:
    """The encoder's input for the first window, (n_mels, 3000), as transcribe makes it: the
    recorded log-mel holds the clip's frames then 3000 frames of padded audio; the window takes
    at most 3000 content frames and pads them with zeros (pad_or_trim), not with the padding."""
    content = min(N_FRAMES, mel.shape[0] - N_FRAMES)
    window = np.zeros((N_FRAMES, mel.shape[1]), dtype=np.float32)
    window[:content] = mel[:content]
    return np.ascontiguousarray(window.T)


def windows(session: Any, profile: Profile) -> list[Window]:
    from harness.goldens.calibration import golden_identity

    out = []
    for scenario_id in profile.certificate.scenarios:
        scenario = profile.scenario(scenario_id)
        golden = session.full_golden(profile, scenario)
        call = golden.extra["decode_calls"][0]
        n = call["n_steps"]
        out.append(
            Window(
                scenario=scenario_id,
                mel=first_window(golden.arrays["mel"]),
                encoder=np.asarray(golden.arrays["encoder"][0], dtype=np.float32),
                initial=[int(t) for t in call["initial_tokens"]],
                tokens=[int(t) for t in golden.tokens[:n]],
                rows=np.asarray(golden.logits[:n], dtype=np.float32),
                golden_identity=golden_identity(golden),
            )
        )
    return out


def run_runtime(runtime: str, model_dir: Path, items: list[Window], isa: str | None, keep: Path) -> dict[str, Any]:
    """The runtime's answers (result.json); its arrays moved into `keep`."""
    job_items = []
    for w in items:
        np.save(keep / f"{w.scenario}.mel.npy", w.mel)
        job_items.append(
            {
                "id": w.scenario,
                "mel": str(keep / f"{w.scenario}.mel.npy"),
                "initial": w.initial,
                "tokens": w.tokens[:-1],
                "max_tokens": 448,  # Whisper's n_text_ctx: it stops at its end-of-text token
            }
        )
    job = {"model_dir": str(model_dir), "compute_type": "float32", "isa": isa, "scenarios": job_items}
    task = f"{runtime} on its own model ({isa or 'default'} ISA)"
    with OracleProcess(runtime).run("certify.py", job, task=task) as out:
        result = json.loads((out / "result.json").read_text())
        for w in items:
            for name in ("encoder", "logits"):
                (out / f"{w.scenario}.{name}.npy").replace(keep / f"{w.scenario}.{name}.npy")
    return result


def measure(profile: Profile, items: list[Window], isa: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per scenario: encoder max |difference|, per-step metrics, the runtime's free tokens."""
    model_dir = original_files(profile.artifact)
    figures = {}
    with work_directory() as folder:
        result = run_runtime(profile.certificate.runtime, model_dir, items, isa, folder)
        for w in items:
            encoder = np.load(folder / f"{w.scenario}.encoder.npy")
            logits = np.load(folder / f"{w.scenario}.logits.npy")
            if encoder.shape != w.encoder.shape:
                raise CertificateError(
                    f"{w.scenario}: runtime encoder output {encoder.shape}, expected {w.encoder.shape}"
                )
            steps = step_metrics(w.rows, logits)
            figures[w.scenario] = {
                "encoder_max_abs": float(np.abs(encoder.astype(np.float64) - w.encoder).max()),
                "steps": [s.as_list() for s in steps],
                "free_tokens": result["scenarios"][w.scenario]["free_tokens"],
                "oracle_tokens": w.tokens[:-1],
            }
    return figures, result["environment"]


def certifies(profile: Profile) -> dict[str, Any]:
    """What a calibration record is tied to (never the converted weights)."""
    spec = profile.artifact
    return {
        "original": {"package": spec.package, "version": spec.version, "file": spec.file, "sha256": spec.sha256},
        "runtime_pins": pins_hash(read_pins(profile.certificate.runtime)),
        "scenarios": list(profile.certificate.scenarios),
    }


def record_path(profile: Profile, device_key: str) -> Path:
    return goldens_dir() / profile.name / device_key / "certificate" / f"{profile.certificate.runtime}.json"


def judge(figures: dict[str, Any], bound: dict[str, Any]) -> list[str]:
    """Every way the figures break the bound, first step first (an empty list: certified)."""
    problems = []
    for scenario, f in figures.items():
        if f["free_tokens"] != f["oracle_tokens"]:
            pairs = zip(f["free_tokens"], f["oracle_tokens"], strict=False)
            at = next(
                (i for i, (a, b) in enumerate(pairs) if a != b), min(len(f["free_tokens"]), len(f["oracle_tokens"]))
            )
            problems.append(f"{scenario}: the runtime's own tokens differ from the oracle's at step {at}")
        if f["encoder_max_abs"] > bound["encoder_max_abs"]:
            worst_encoder, limit = f["encoder_max_abs"], bound["encoder_max_abs"]
            problems.append(f"{scenario}: encoder output max |diff| {worst_encoder:.3g} > bound {limit:.3g}")
        steps = [StepMetrics(*s) for s in f["steps"]]
        for i, s in enumerate(steps):
            if s.kl > bound["max_kl"] or s.max_abs > bound["max_abs"]:
                problems.append(
                    f"{scenario}: step {i}: KL {s.kl:.3g} (bound {bound['max_kl']:.3g}), max |logit diff| "
                    f"{s.max_abs:.3g} (bound {bound['max_abs']:.3g})"
                )
                break
        agreement = worst(steps)["top1_agreement"]
        if agreement < bound["min_top1_agreement"]:
            problems.append(f"{scenario}: top-1 agreement {agreement:.3f} < {bound['min_top1_agreement']:.3f}")
    return problems


def certify(session: Any, profile: Profile) -> dict[str, Any]:
    """The certificate: PASS (every figure within the record's bound), FAIL (which and where),
    or ERROR (no usable record, the runtime failed): never a pass without a bound."""
    from harness.provenance import golden_key

    key = golden_key(profile.oracle).name
    doc: dict[str, Any] = {
        "profile": profile.name,
        "runtime": profile.certificate.runtime,
        "device_key": key,
        "generated": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    try:
        record = read_record(
            record_path(profile, key), profile.name, profile.certificate.runtime, key, certifies(profile)
        )
        figures, environment = measure(profile, windows(session, profile), None)
    except CertificateError as e:
        return doc | {"verdict": "ERROR", "problems": [str(e)]}
    problems = judge(figures, record.bound)
    summary = {
        s: worst([StepMetrics(*x) for x in f["steps"]]) | {"encoder_max_abs": f["encoder_max_abs"]}
        for s, f in figures.items()
    }
    return doc | {
        "verdict": "FAIL" if problems else "PASS",
        "problems": problems,
        "bound": record.bound,
        "figures": summary,
        "runtime_environment": environment,
        "certifies": record.certifies,
    }


def calibrate(session: Any, profile: Profile, write: bool, isas: list[str], command: str) -> CertificateRecord:
    """The runtime's own spread over its CPU kernels, per ISA; written only with `write`."""
    from harness.goldens.lifecycle import harness_commit
    from harness.provenance import golden_key

    key = golden_key(profile.oracle).name
    items = windows(session, profile)
    calibration, environments = {}, {}
    for isa in isas:
        figures, environments[isa] = measure(profile, items, isa)
        for scenario, f in figures.items():
            if f["free_tokens"] != f["oracle_tokens"]:
                raise CertificateError(
                    f"calibration: {profile.certificate.runtime} ({isa}) chose other tokens than the oracle on "
                    f"{scenario}: not a benign spread (a wrong conversion?); nothing written"
                )
        calibration[isa] = {
            s: {"encoder_max_abs": f["encoder_max_abs"], "steps": f["steps"]} for s, f in figures.items()
        }
    record = CertificateRecord(
        profile=profile.name,
        runtime=profile.certificate.runtime,
        device_key=key,
        certifies=certifies(profile),
        calibration=calibration,
        bound=bound_of(calibration),
        measured_against={w.scenario: w.golden_identity for w in items},
        origin={
            "command": command,
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": platform.node(),
            "commit": harness_commit(),
            "runtime_environment": environments,
        },
    )
    if write:
        write_record(record_path(profile, key), record)
    return record
