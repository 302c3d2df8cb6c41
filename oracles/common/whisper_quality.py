"""Quantization quality of a Whisper pair (control, candidate), computed by mlx-whisper in its
own venv: the oracle side of harness/quality/whisper.py. Loaded by oracles/mlx-whisper/quality.py.

Per fixture, all greedy at temperature 0 (a one-entry ladder: no temperature fallback; every
other transcribe option is mlx-whisper's default or the spec's):
  1. the control transcribes it (free run), with the golden generator's captures
     (generate.run_scenario: every kept decode step's pre-filter logits and chosen token); each
     decode call's DecodingOptions and mel window are kept as well;
  2. the candidate transcribes it (free run): its own transcript;
  3. the candidate is teacher-forced on the control's path: for every control decode call, a
     DecodingTask of the candidate with that call's options (its prompt, language, ...) runs on
     that call's mel window, every step's chosen token replaced by the control's (EOT past the
     control's end), and its pre-filter logits are captured. Where the candidate's free run
     encoded the same window, its encoder output is handed in (mlx-whisper then skips the
     encoder: the same bits, one encoder pass fewer);
  4. per step, KL(control || candidate) of the pre-filter logits, in float32, with mlx-lm
     0.32.2's `tuner.losses.kl_div_loss` op sequence on a device without Metal (it is not in
     this venv: the same mlx ops, written here), and each side's argmax.

Written per fixture: <id>.kl.npy (float32), <id>.control_top1.npy and <id>.candidate_top1.npy
(int64), and in the result: the transcripts, tokens, decode calls and the sha256 of every
logits row (control, forced candidate), for the harness's cross-check with the in-tree runtime.

Standard library only at import; mlx and mlx_whisper are imported inside the functions.
"""

from __future__ import annotations

import hashlib
import importlib

import whisper_run

KNOWN_KEYS = frozenset({"control_dir", "candidate_dir", "scenarios"})


class QualityError(RuntimeError):
    """The forced run did not follow the control: its figures would not be step for step."""


def spec_problems(spec) -> list[str]:
    """What the quality spec adds to the generator's checks: two model dirs, greedy decoding."""
    if not isinstance(spec, dict):
        return ['spec: expected {"control_dir", "candidate_dir", "scenarios"}']
    problems = [f"unknown key {k!r}" for k in sorted(set(spec) - KNOWN_KEYS)]
    if spec.get("control_dir") == spec.get("candidate_dir"):
        problems.append("candidate_dir: the same directory as control_dir")
    for n, scenario in enumerate(spec.get("scenarios") or []):
        options = scenario.get("options", {}) if isinstance(scenario, dict) else {}
        if not isinstance(options, dict):
            continue
        if options.get("temperature") != 0.0 or isinstance(options.get("temperature"), bool):
            problems.append(f"scenarios[{n}]: options.temperature: quality runs greedy, expected 0.0")
        for key in ("beam_size", "best_of"):
            if options.get(key) is not None:
                problems.append(f"scenarios[{n}]: options.{key}: quality runs greedy, without {key}")
    return problems


def kl_per_step(control_rows, candidate_rows):
    """KL(control || candidate) per row, float32: mlx-lm's kl_div_loss(logits_q=candidate,
    logits_p=control) without Metal, i.e. nn.losses.kl_div_loss(log q, log p) with reduction none."""
    import mlx.core as mx
    import mlx.nn as nn

    logits_p, logits_q = mx.array(control_rows), mx.array(candidate_rows)
    return nn.losses.kl_div_loss(
        logits_q - mx.logsumexp(logits_q, axis=-1, keepdims=True),
        logits_p - mx.logsumexp(logits_p, axis=-1, keepdims=True),
        axis=-1,
        reduction="none",
    )


def row_digests(rows) -> list[str]:
    return [hashlib.sha256(row.tobytes()).hexdigest() for row in rows]


def _recording_windows(windows):
    """A DecodingTask.run wrapper that keeps each call's (options, mel window)."""
    decoding = importlib.import_module("mlx_whisper.decoding")
    orig_run = decoding.DecodingTask.run

    def run(task, mel):
        windows.append((task.options, mel))
        return orig_run(task, mel)

    return whisper_run.patched([(decoding.DecodingTask, "run", run)])


def forced_rows(model, windows, decode_calls, features_by_window, eot):
    """The candidate `model`'s pre-filter logits rows, teacher-forced on the control's decode
    calls (`windows`: each call's (options, mel)); returns (rows float32 numpy, encoder passes saved)."""
    import mlx.core as mx
    import numpy as np

    decoding = importlib.import_module("mlx_whisper.decoding")
    orig_logits, orig_update = decoding.Inference.logits, decoding.GreedyDecoder.update
    state = {"rows": [], "step": 0, "member": []}

    def logits(inference, tokens, audio_features):
        out = orig_logits(inference, tokens, audio_features)
        state["rows"].append(out[:, -1, :])
        return out

    def update(decoder, tokens, logits_, sum_logprobs):
        out, _, sums = orig_update(decoder, tokens, logits_, sum_logprobs)
        step, member = state["step"], state["member"]
        state["step"] += 1
        forced = member[step] if step < len(member) else eot
        last = mx.array([[forced]], dtype=out.dtype)
        return mx.concatenate([out[:, :-1], last], axis=-1), mx.array(forced == eot), sums

    all_rows, reused = [], 0
    with whisper_run.patched([(decoding.Inference, "logits", logits), (decoding.GreedyDecoder, "update", update)]):
        for (options, mel), call in zip(windows, decode_calls, strict=True):
            if call["batch"] != 1:
                raise QualityError(f"decode call at seek {call['seek']}: batch {call['batch']}, expected 1 (greedy)")
            state.update(rows=[], step=0, member=call["member_tokens"][0])
            features = features_by_window.get((call["seek"], call["segment_frames"]))
            if features is not None:
                reused += 1
            decoding.DecodingTask(model, options).run(mel if features is None else mx.array(features)[None])
            if len(state["rows"]) < call["n_steps"]:
                raise QualityError(
                    f"decode call at seek {call['seek']}: the forced run computed {len(state['rows'])} steps, "
                    f"the control kept {call['n_steps']}"
                )
            all_rows += [np.array(r[0].astype(mx.float32)) for r in state["rows"][: call["n_steps"]]]
    return all_rows, reused


def measure_fixture(run_scenario, load_model, control_dir, candidate_dir, scenario, out):
    """One fixture's figures; writes its arrays into `out`, returns its JSON record."""
    import mlx.core as mx
    import numpy as np

    windows = []
    fp16 = bool(scenario.get("options", {}).get("fp16", False))
    control_model = load_model(control_dir, fp16)
    with _recording_windows(windows):
        control_meta, control_arrays = run_scenario(control_dir, control_model, scenario)
    calls = control_meta["decode_calls"]
    if len(windows) != len(calls) or not all(c["kept"] for c in calls):
        raise QualityError(f"{len(windows)} decode calls seen for {len(calls)} recorded, or a call not kept")
    control_rows = control_arrays["logits"]

    candidate_model = load_model(candidate_dir, fp16)
    candidate_meta, candidate_arrays = run_scenario(candidate_dir, candidate_model, scenario)
    features_by_window = {
        (c["seek"], c["segment_frames"]): candidate_arrays["encoder"][i]
        for i, c in enumerate(candidate_meta["decode_calls"])
    }
    rows, reused = forced_rows(candidate_model, windows, calls, features_by_window, control_meta["eos_ids"][0])
    forced = np.stack(rows).astype(np.float32) if rows else np.zeros_like(control_rows)
    if forced.shape != control_rows.shape:
        raise QualityError(f"forced rows {forced.shape} do not match the control's {control_rows.shape}")

    kl = np.array(kl_per_step(control_rows, forced)) if len(forced) else np.zeros(0, np.float32)
    top1 = {
        "control": np.array(mx.argmax(mx.array(control_rows), axis=-1)).astype(np.int64),
        "candidate": np.array(mx.argmax(mx.array(forced), axis=-1)).astype(np.int64),
    }
    sid = scenario["id"]
    np.save(out / f"{sid}.kl.npy", kl.astype(np.float32), allow_pickle=False)
    for side, array in top1.items():
        np.save(out / f"{sid}.{side}_top1.npy", array, allow_pickle=False)
    keep = ("seek", "segment_frames", "n_steps", "initial_tokens", "member_tokens", "temperature")
    return {
        "steps": int(len(kl)),
        "control": {
            "text": control_meta["transcript"]["text"],
            "tokens": control_meta["tokens"],
            "decode_calls": [{k: c[k] for k in keep} for c in calls],
            "row_sha256": row_digests(control_rows),
        },
        "candidate": {
            "text": candidate_meta["transcript"]["text"],
            "tokens": candidate_meta["tokens"],
            "forced_row_sha256": row_digests(forced),
            "encoder_outputs_reused": reused,
        },
    }
