"""The conversion certificate (issue 33 part 6): the converted weights, as the mlx oracle computes
them (its goldens), against the original file run by its own runtime (CTranslate2 on model.bin).

The oracle and the in-tree side load the same converted weights, so no L1 gate sees a converter
bug; this does. Per certificate scenario (a profile's `certificate.scenarios`) it takes the
golden — a greedy Whisper scenario's first window (log-mel, encoder output, every logits row of
its first decode call, the tokens chosen), or a plain/chat LLM scenario's prompt ids, logits rows
and tokens — hands the inputs and tokens to the runtime (oracles/<runtime>/certify.py, in its own
venv: CTranslate2 on model.bin, llama.cpp on the GGUF) and compares: the runtime's encoder output
(Whisper), its logits teacher-forced on the oracle's tokens (harness/certificate/metrics.py) and
its own free greedy tokens. The bound is the profile's calibration record on this golden key
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

from harness.artifacts.files import sha256_file
from harness.artifacts.resolve import original_files
from harness.certificate.metrics import StepMetrics, step_metrics, worst
from harness.certificate.record import CertificateError, CertificateRecord, bound_of, read_record, write_record
from harness.implementations import LLM
from harness.oracle.descriptor import descriptor
from harness.oracle.pins import pins_hash, read_pins
from harness.oracle.process import OracleProcess, work_directory
from harness.paths import goldens_dir
from harness.profile import Profile

ISAS = ("GENERIC", "AVX", "AVX2", "AVX512")  # CTranslate2's CPU kernels (CT2_FORCE_CPU_ISA)
N_FRAMES = 3000  # one 30 s window of log-mel frames
# llama.cpp has no runtime ISA switch: its own spread is over threads and batch sizes (token by
# token against a batched prompt: other kernels, other reduction orders).
LLAMA_SETTINGS = ("threads1-batch512", "threads2-batch512", "threads2-batch1")


@dataclasses.dataclass(frozen=True)
class Window:
    """What the runtime is handed of one scenario's golden, and what it is compared with."""

    scenario: str
    mel: np.ndarray | None  # (n_mels, 3000); None for an LLM
    encoder: np.ndarray | None  # (n_audio_ctx, n_audio_state); None for an LLM
    initial: list[int]  # Whisper's initial tokens, or an LLM's prompt ids
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
        if profile.under_test.produces == LLM:
            rows = np.asarray(golden.logits, dtype=np.float32)
            ids, tokens = [int(t) for t in golden.prompt_ids], [int(t) for t in golden.tokens]
            out.append(Window(scenario_id, None, None, ids, tokens, rows, golden_identity(golden)))
            continue
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


def run_runtime(runtime: str, model_dir: Path, items: list[Window], setting: str | None, keep: Path) -> dict[str, Any]:
    """The runtime's answers (result.json); its arrays moved into `keep`."""
    job_items = []
    for w in items:
        item = {"id": w.scenario, "initial": w.initial, "tokens": w.tokens[:-1], "max_tokens": len(w.tokens)}
        if w.mel is not None:
            np.save(keep / f"{w.scenario}.mel.npy", w.mel)
            item |= {"mel": str(keep / f"{w.scenario}.mel.npy"), "max_tokens": 448}  # Whisper stops at its EOT
        job_items.append(item)
    job = {"model": str(model_dir), "compute_type": "float32", "setting": setting, "scenarios": job_items}
    task = f"{runtime} on its own model ({setting or 'default'})"
    with OracleProcess(runtime).run("certify.py", job, task=task) as out:
        result = json.loads((out / "result.json").read_text())
        for w in items:
            for name in ("encoder", "logits") if w.encoder is not None else ("logits",):
                (out / f"{w.scenario}.{name}.npy").replace(keep / f"{w.scenario}.{name}.npy")
    return result


def measure(profile: Profile, items: list[Window], setting: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per scenario: encoder max |difference|, per-step metrics, the runtime's free tokens."""
    model_dir = original_files(profile.artifact)
    figures = {}
    with work_directory() as folder:
        result = run_runtime(profile.certificate.runtime, model_dir, items, setting, folder)
        for w in items:
            logits = np.load(folder / f"{w.scenario}.logits.npy")
            encoder_max_abs = None
            if w.encoder is not None:
                encoder = np.load(folder / f"{w.scenario}.encoder.npy")
                if encoder.shape != w.encoder.shape:
                    raise CertificateError(
                        f"{w.scenario}: runtime encoder output {encoder.shape}, expected {w.encoder.shape}"
                    )
                encoder_max_abs = float(np.abs(encoder.astype(np.float64) - w.encoder).max())
            steps = step_metrics(w.rows, logits)
            figures[w.scenario] = {
                "encoder_max_abs": encoder_max_abs,
                "steps": [s.as_list() for s in steps],
                "free_tokens": result["scenarios"][w.scenario]["free_tokens"],
                "oracle_tokens": w.tokens[:-1],
                "divergence": divergence(result["scenarios"][w.scenario]["free_tokens"], w.tokens[:-1], w.rows),
            }
    return figures, result["environment"]


def divergence(free: list[int], oracle: list[int], rows: np.ndarray) -> dict[str, Any] | None:
    """Where the runtime's own greedy tokens first leave the oracle's, and the oracle's margin there
    (its logit for its token minus its logit for the runtime's): None when they never do."""
    at = next((i for i, (a, b) in enumerate(zip(free, oracle, strict=False)) if a != b), None)
    if at is None:
        if len(free) == len(oracle):
            return None
        at = min(len(free), len(oracle))
        return {"step": at, "oracle": None, "runtime": None, "margin": float("inf")}
    margin = float(rows[at][oracle[at]]) - float(rows[at][free[at]])
    return {"step": at, "oracle": oracle[at], "runtime": free[at], "margin": margin}


def near_tie(d: dict[str, Any] | None, max_abs: float) -> bool:
    """A divergence the runtime's own logit differences can explain: the oracle's margin there is
    within the largest |logit difference| the bound allows (either side may move by that much)."""
    return d is None or d["margin"] <= max_abs


def certifies(profile: Profile) -> dict[str, Any]:
    """What a calibration record is tied to (never the converted weights)."""
    spec = profile.artifact
    return {
        "original": {"package": spec.package, "version": spec.version, "file": spec.file, "sha256": spec.sha256},
        "runtime_pins": pins_hash(read_pins(profile.certificate.runtime)),
        "runtime_script": sha256_file(descriptor(profile.certificate.runtime).script("certify.py")),
        "scenarios": list(profile.certificate.scenarios),
    }


def oracle_of_certificate(profile: Profile) -> str:
    """The oracle whose goldens are certified (the profile's, or its variant: one for all its scenarios)."""
    return profile.oracle_of(profile.scenario(profile.certificate.scenarios[0]))


def record_path(profile: Profile, device_key: str) -> Path:
    return goldens_dir() / profile.name / device_key / "certificate" / f"{profile.certificate.runtime}.json"


def judge(figures: dict[str, Any], bound: dict[str, Any]) -> list[str]:
    """Every way the figures break the bound, first step first (an empty list: certified)."""
    problems = []
    for scenario, f in figures.items():
        d = f["divergence"]
        if not near_tie(d, bound["max_abs"]):
            problems.append(
                f"{scenario}: the runtime's own tokens differ from the oracle's at step {d['step']}, not a near-tie "
                f"(the oracle's margin {d['margin']:.3g} > bound {bound['max_abs']:.3g})"
            )
        if f["encoder_max_abs"] is not None and f["encoder_max_abs"] > bound["encoder_max_abs"]:
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

    key = golden_key(oracle_of_certificate(profile)).name
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


def calibrate(session: Any, profile: Profile, write: bool, settings: list[str], command: str) -> CertificateRecord:
    """The runtime's own spread over its settings (CPU ISAs, threads/batch); written only with `write`."""
    from harness.goldens.lifecycle import harness_commit
    from harness.provenance import golden_key

    key = golden_key(oracle_of_certificate(profile)).name
    items = windows(session, profile)
    calibration, environments = {}, {}
    for setting in settings:
        figures, environments[setting] = measure(profile, items, setting)
        calibration[setting] = {
            s: {"encoder_max_abs": f["encoder_max_abs"], "steps": f["steps"], "divergence": f["divergence"]}
            for s, f in figures.items()
        }
    bound = bound_of(calibration)
    for setting, scenarios in calibration.items():
        for scenario, f in scenarios.items():
            if not near_tie(f["divergence"], bound["max_abs"]):
                raise CertificateError(
                    f"calibration: {profile.certificate.runtime} ({setting}) leaves the oracle's tokens on "
                    f"{scenario} at step {f['divergence']['step']} by more than a near-tie (margin "
                    f"{f['divergence']['margin']:.3g} > {bound['max_abs']:.3g}): not a benign spread (a wrong "
                    "conversion?); nothing written"
                )
    record = CertificateRecord(
        profile=profile.name,
        runtime=profile.certificate.runtime,
        device_key=key,
        certifies=certifies(profile),
        calibration=calibration,
        bound=bound,
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
