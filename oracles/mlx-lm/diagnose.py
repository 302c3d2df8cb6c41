"""Divergence localization, oracle side: the output of every module on one model call.

Runs one scenario exactly as generate.py does (its own functions, loaded by file path) with
module taps (oracles/common/module_taps.py) armed on the model call that predicts the job's `row`,
and writes each tapped module's last-position output to `modules.npz` (names in execution
order in `modules.json`). Never imports the harness; runs inside the oracle's venv.

Usage: python -I diagnose.py --job JOB.json --out DIR, the job
  {"model_dir": DIR, "scenario": {...a generate.py scenario...}, "row": N}
"""

import importlib.util
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def load_by_path(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    base = load_by_path("oracle_base", HERE.parent / "common" / "oracle_base.py")
    job, out = base.job_and_out(__doc__.splitlines()[0])
    generate = load_by_path("oracle_generate", HERE / "generate.py")
    taps_module = load_by_path("module_taps", HERE.parent / "common" / "module_taps.py")
    scenario, row = job["scenario"], int(job["row"])
    model, tokenizer = generate.load(job["model_dir"])
    _, prompt_ids = generate.encode_prompt(tokenizer, scenario)
    target = taps_module.prefill_calls(len(prompt_ids), scenario["prefill_step_size"]) + row
    taps = taps_module.ModuleTaps(model, target)
    try:
        generate.run_scenario(model, tokenizer, scenario)
    finally:
        taps.remove()
    outputs = taps.outputs()
    np.savez(out / "modules.npz", **outputs)
    (out / "modules.json").write_text(json.dumps({"order": list(outputs), "target_call": target}))


if __name__ == "__main__":
    main()
