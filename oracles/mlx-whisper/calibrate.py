"""mlx-whisper against itself under benign changes: the noise floor an L2 budget is derived from.

Runs inside the mlx-whisper oracle venv, never imports the harness. For each clip it transcribes
once as the goldens do (the reference) and once per variant, each a change that a correct
implementation may make without being wrong:

  no-compile  `mx.disable_compile()`: mlx's compiled kernels (GELU among them) unfused
  batch2      every decode call decodes its window twice, batched (n_audio = 2), keeps member 0
  fp16        `fp16=True`: float16 compute instead of float32

and writes, per clip and run, every decode call's window, temperature and kept tokens, and each
step's pre-filter logits and chosen token of member 0, so the harness can count the differing
tokens and explain each first divergence (margin against logit error).

Usage: python -I calibrate.py --job JOB.json --out DIR
spec: {"model_dir": ..., "clips": [{"id", "audio"}], "options": {...}, "variants": [...]}
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import sys
from pathlib import Path

VARIANTS = ("no-compile", "batch2", "fp16")


# oracles/common, by path: the oracle venv does not have this repository on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "common"))
import oracle_base as base  # noqa: E402
from whisper_run import patched as _patched  # noqa: E402  (the generators' run-time patching)


def _fp16_model_dir(model_dir: str, out: Path) -> str:
    """The same weights cast to float16 (mlx-whisper's loader keeps the stored dtype, and its
    fp16 path needs float16 weights)."""
    import shutil

    import mlx.core as mx

    target = out / "fp16-model"
    if not target.exists():
        target.mkdir(parents=True)
        shutil.copy(Path(model_dir) / "config.json", target / "config.json")
        weights = mx.load(str(Path(model_dir) / "weights.safetensors"))
        cast = {k: v.astype(mx.float16) if mx.issubdtype(v.dtype, mx.floating) else v for k, v in weights.items()}
        mx.save_safetensors(str(target / "weights.safetensors"), cast)
    return str(target)


def transcribe_once(model_dir: str, audio: str, options: dict, variant: str | None):
    """One transcription; returns (decode calls, logits rows of member 0, transcript)."""
    import mlx.core as mx
    import numpy as np

    decoding = importlib.import_module("mlx_whisper.decoding")
    tmod = importlib.import_module("mlx_whisper.transcribe")
    calls, rows = [], []
    current = {}
    orig_run, orig_logits, orig_update = (
        decoding.DecodingTask.run,
        decoding.Inference.logits,
        decoding.GreedyDecoder.update,
    )

    def run(task, mel):
        current.clear()
        current.update({"temperature": task.options.temperature, "rows": [], "chosen": []})
        if variant == "batch2":
            results = orig_run(task, mx.concatenate([mel, mel], axis=0))[:1]
        else:
            results = orig_run(task, mel)
        (result,) = results
        n_steps = len(current["chosen"])
        calls.append(
            {
                "temperature": float(current["temperature"]),
                "tokens": [int(t) for t in result.tokens],
                "row_offset": len(rows),
                "n_steps": n_steps,
                "chosen": [int(c.item()) for c in current["chosen"]],
            }
        )
        rows.extend(np.array(r.astype(mx.float32)) for r in current["rows"])
        return results

    def logits(inference, tokens, audio_features):
        out = orig_logits(inference, tokens, audio_features)
        current["rows"].append(out[0, -1, :])
        return out

    def update(decoder, tokens, logits_, sum_logprobs):
        out = orig_update(decoder, tokens, logits_, sum_logprobs)
        current["chosen"].append(out[0][0, -1])  # lazy: read after the call, as the capture in generate.py
        return out

    options = dict(options)
    options["fp16"] = variant == "fp16"
    decoding.categorical = mx.compile(lambda lg, temp: mx.random.categorical(lg / temp))
    mx.random.seed(0)
    tmod.ModelHolder.model = None  # its cache ignores the dtype: load per run
    if variant == "no-compile":
        mx.disable_compile()
    try:
        with _patched(
            [
                (decoding.DecodingTask, "run", run),
                (decoding.Inference, "logits", logits),
                (decoding.GreedyDecoder, "update", update),
            ]
        ):
            transcript = tmod.transcribe(audio, path_or_hf_repo=model_dir, verbose=None, **options)
    finally:
        if variant == "no-compile":
            mx.enable_compile()
    # The loop computes one look-ahead step it does not keep: keep the rows of chosen tokens only.
    kept_rows = []
    for call in calls:
        call_rows = rows[call["row_offset"] : call["row_offset"] + len(call["chosen"])]
        call["row_offset"] = len(kept_rows)
        kept_rows.extend(call_rows)
    segments = [{"seek": s["seek"], "tokens": [int(t) for t in s["tokens"]]} for s in transcript["segments"]]
    vocab = rows[0].shape[-1] if rows else 0
    logits_rows = np.stack(kept_rows).astype(np.float32) if kept_rows else np.zeros((0, vocab), np.float32)
    return calls, logits_rows, {"text": transcript["text"], "segments": segments}


def main() -> None:
    spec, out = base.job_and_out("mlx-whisper calibration: the oracle against its own variants")
    bad = [v for v in spec.get("variants", []) if v not in VARIANTS]
    if bad or not spec.get("clips") or not Path(spec.get("model_dir", "")).is_dir():
        print(
            f"calibrate: bad spec (unknown variants {bad}, clips, or model_dir); variants: {VARIANTS}", file=sys.stderr
        )
        sys.exit(2)
    import mlx.core as mx
    import numpy as np

    result = {"clips": {}}
    for clip in spec["clips"]:
        runs = {}
        for variant in [None, *spec["variants"]]:
            name = variant or "reference"
            model_dir = _fp16_model_dir(spec["model_dir"], out) if variant == "fp16" else spec["model_dir"]
            calls, rows, transcript = transcribe_once(model_dir, clip["audio"], spec.get("options", {}), variant)
            np.save(out / f"{clip['id']}.{name}.npy", rows, allow_pickle=False)
            runs[name] = {"decode_calls": calls, "transcript": transcript}
            print(f"calibrate: {clip['id']} {name}: {transcript['text']!r}", file=sys.stderr, flush=True)
        result["clips"][clip["id"]] = runs
    result["environment"] = {
        "mlx": importlib.metadata.version("mlx"),
        "mlx-whisper": importlib.metadata.version("mlx-whisper"),
        "device": str(mx.default_device()),
    }
    (out / "result.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
