"""mlx-whisper quality entry: a Whisper candidate against its control, measured by the oracle
library in its own venv (harness/quality/whisper.py launches it; the figures' definitions are
in oracles/common/whisper_quality.py). Never imports the harness.

The control's and the candidate's free runs are the golden generator's own transcription with
captures (generate.run_scenario, imported unchanged), so a control run here computes what the
profile's goldens record for the same options.

Usage: python -I quality.py --job JOB.json --out DIR
  spec: {"control_dir", "candidate_dir", "scenarios": [{id, kind: "transcribe", audio, options, seed}]}
  DIR:  result.json ({"fixtures": {id: record}, "environment": ...}) and each fixture's arrays.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# oracles/common by path: the venv does not have this repository on sys.path.
sys.path.insert(0, str(HERE.parent / "common"))
import oracle_base as base  # noqa: E402
import whisper_quality as quality  # noqa: E402
import whisper_spec as spec_check  # noqa: E402


def _load_generator():
    """The golden generator beside this file, by path under its own name (no clash with any
    other module called `generate`); loading it runs nothing but its imports."""
    spec = importlib.util.spec_from_file_location("mlx_whisper_oracle_generate", HERE / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generate = _load_generator()


def validate_spec(spec) -> None:
    """Raise SpecError naming every problem, before anything is loaded or run."""
    problems = quality.spec_problems(spec)
    for key in ("control_dir", "candidate_dir"):
        try:
            generate.validate_spec({"model_dir": spec.get(key), "scenarios": spec.get("scenarios")})
        except spec_check.SpecError as e:
            problems += [f"{key}: {line.strip()}" for line in str(e).splitlines()[1:]]
    if problems:
        raise spec_check.SpecError("invalid quality spec:\n  " + "\n  ".join(dict.fromkeys(problems)))


def main():
    args = base.parser("mlx-whisper quality: KL and top-1 of a candidate against its control").parse_args()
    spec = spec_check.checked_spec(args.job, validate_spec)

    import mlx.core as mx

    tmod = importlib.import_module("mlx_whisper.transcribe")

    def load_model(model_dir, fp16):
        # transcribe's own loader and cache, in the dtype transcribe asks for (float16 with
        # fp16, else float32), emptied first so the dtype is always this one (as generate.main).
        tmod.ModelHolder.model = None
        return tmod.ModelHolder.get_model(model_dir, mx.float16 if fp16 else mx.float32)

    args.out.mkdir(parents=True, exist_ok=True)
    result = {"fixtures": {}}
    for scenario in spec["scenarios"]:
        record = quality.measure_fixture(
            generate.run_scenario, load_model, spec["control_dir"], spec["candidate_dir"], scenario, args.out
        )
        result["fixtures"][scenario["id"]] = record
        print(f"oracle quality: {scenario['id']}: {record['steps']} steps", file=sys.stderr, flush=True)
    result["environment"] = generate.environment()
    (args.out / "result.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
