"""Divergence localization, oracle side: the output of every module on one model call.

Runs one scenario exactly as generate.py does (its own functions, loaded by file path) with
module taps (oracles/common/module_taps.py) armed on the model call that predicts `--row`,
and writes each tapped module's last-position output to `modules.npz` (names in execution
order in `modules.json`). Never imports the harness; runs inside the oracle's venv.

Usage: python -I diagnose.py --spec spec.json --scenario ID --row N --out DIR
"""

import argparse
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
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--row", required=True, type=int)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    generate = load_by_path("oracle_generate", HERE / "generate.py")
    taps_module = load_by_path("module_taps", HERE.parent / "common" / "module_taps.py")
    spec = json.loads(args.spec.read_text())
    scenario = next(s for s in spec["scenarios"] if s["id"] == args.scenario)
    model, tokenizer = generate.load(spec["model_dir"])
    _, prompt_ids = generate.encode_prompt(tokenizer, scenario)
    target = taps_module.prefill_calls(len(prompt_ids), scenario["prefill_step_size"]) + args.row
    taps = taps_module.ModuleTaps(model, target)
    try:
        generate.run_scenario(model, tokenizer, scenario)
    finally:
        taps.remove()
    outputs = taps.outputs()
    np.savez(args.out / "modules.npz", **outputs)
    (args.out / "modules.json").write_text(json.dumps({"order": list(outputs), "target_call": target}))


if __name__ == "__main__":
    main()
