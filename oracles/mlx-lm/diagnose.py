"""Divergence localization, oracle side: the output of every module on one model call.

Runs one scenario exactly as generate.py does (its own functions, loaded by file path) with
module taps (oracles/common/module_taps.py) armed on the model call that predicts the job's `row`,
and writes each tapped module's last-position output to `modules.npz` (names in execution
order in `modules.json`). Never imports the harness; runs inside the oracle's venv.

Usage: python -I diagnose.py --job JOB.json --out DIR, the job
  {"model_dir": DIR, "scenario": {...a generate.py scenario...}, "row": N}
or, with --serve, the job {"model_dir": DIR}: the model is loaded once, `{"status": "ready"}`
is printed, then each stdin line {"scenario": {...}, "row": N, "out": DIR} is answered in
DIR and with one stdout line, {"status": "done"} or {"status": "error", "error": "..."}.
"""

import importlib.util
import json
import sys
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
    args = base.parser(__doc__.splitlines()[0], serve=True).parse_args()
    job, out = base.read_job(args)
    generate = load_by_path("oracle_generate", HERE / "generate.py")
    taps_module = load_by_path("module_taps", HERE.parent / "common" / "module_taps.py")
    model, tokenizer = generate.load(job["model_dir"])
    if not args.serve:
        tap(generate, taps_module, model, tokenizer, job["scenario"], int(job["row"]), out)
        return
    print(json.dumps({"status": "ready"}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            tap(generate, taps_module, model, tokenizer, request["scenario"], int(request["row"]), Path(request["out"]))
        except Exception as e:  # noqa: BLE001 - answered, and the next request is served
            print(json.dumps({"status": "error", "error": f"{type(e).__name__}: {e}"}), flush=True)
        else:
            print(json.dumps({"status": "done"}), flush=True)


def tap(generate, taps_module, model, tokenizer, scenario, row, out):
    """Run the scenario as generate.py does, with the taps armed on the call that predicts `row`."""
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
